package redlockstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

func TestIdemConformance(t *testing.T) {
	t.Parallel()
	addrs := testenv.RedisAddrs(t, 5)[:5]
	idemtest.Run(t, idemtest.Config{
		// 64 duplicates at once on five nodes, under the race detector on
		// two loaded cores: a node can take longer than the default node
		// timeout (TTL/10, at most 1 s) to answer, which is a quorum error,
		// not a wrong answer. The suite checks answers: nodes get 3 s.
		NewStore: func(t *testing.T) idemdriver.Store {
			return newStore(t, clients(t, addrs), redlockstore.WithNodeTimeout(3*time.Second))
		},
		FenceAtLeast:       true, // each node keeps its own fence
		AttemptsMayRunHigh: true, // a Begin that missed a majority is counted on the nodes it took
		Settle: func(t *testing.T, st idemdriver.Store) {
			if !redlockstore.Settle(st.(*redlockstore.Store), 10*time.Second) {
				t.Fatal("node requests still running in the background after 10 s")
			}
		},
		RunnerProcess: true,
		Corrupt: func(t *testing.T, key string) {
			// A record of an unknown version on every node.
			for _, a := range addrs {
				c := redis.NewClient(&redis.Options{Addr: a})
				err := c.HSet(context.Background(), "oncekit:redlock-idem:{"+key+"}", "v", "9").Err()
				c.Expire(context.Background(), "oncekit:redlock-idem:{"+key+"}", time.Minute)
				c.Close()
				if err != nil {
					t.Fatal(err)
				}
			}
		},
	})
}
