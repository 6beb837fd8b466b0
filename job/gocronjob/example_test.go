package gocronjob_test

import (
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/oncekit/oncekit/job/gocronjob"
	"github.com/oncekit/oncekit/storage/memstore"
)

// Every replica runs the same gocron scheduler with the Locker: at each
// tick the replica that takes the job's lock runs it and the others skip
// it. (Here two schedulers in one process over one store stand for two
// replicas.)
func Example() {
	store := memstore.New() // a store the replicas share: Redis, etcd, SQL, ZooKeeper
	defer store.Close()
	ran := make(chan int, 8)
	start := time.Now().Truncate(time.Second).Add(time.Second)
	for replica := range 2 {
		locker, err := gocronjob.NewLocker(store)
		if err != nil {
			fmt.Println(err)
			return
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
		if err != nil {
			fmt.Println(err)
			return
		}
		_, err = s.NewJob(gocron.DurationJob(time.Second), gocron.NewTask(func() { ran <- replica }),
			gocron.WithName("nightly-report"), gocron.WithStartAt(gocron.WithStartDateTime(start)))
		if err != nil {
			fmt.Println(err)
			return
		}
		s.Start()
		defer s.Shutdown()
	}
	<-ran
	time.Sleep(500 * time.Millisecond) // the other replica's tick came and was skipped
	fmt.Println("runs of the first tick:", 1+len(ran))
	// Output: runs of the first tick: 1
}
