package lock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/storage/memstore"
)

// Acquire a key, use the fence, release.
func Example() {
	ctx := context.Background()
	var locker lock.Locker = memstore.New() // or redisstore.New(redisClient)

	lease, err := locker.Acquire(ctx, "order:42", 10*time.Second)
	if err != nil {
		fmt.Println("acquire:", err)
		return
	}
	defer lease.Release(ctx)
	fmt.Println("holding", lease.Key(), "with a fence:", lease.Fence() > 0)
	// Output: holding order:42 with a fence: true
}

// TryAcquire does not wait; a held key reports the holder's remaining TTL.
func ExampleLocker_tryAcquire() {
	ctx := context.Background()
	locker := memstore.New()
	first, _ := locker.TryAcquire(ctx, "sku:phone", time.Minute)
	defer first.Release(ctx)

	_, err := locker.TryAcquire(ctx, "sku:phone", time.Minute)
	var held *lock.BusyError
	fmt.Println(errors.Is(err, lock.ErrNotAcquired), errors.As(err, &held) && held.TTL > 59*time.Second)
	// Output: true true
}

// Mutex.Do keeps the lease alive while the function runs and cancels the
// function's context if the lease is lost.
func ExampleMutex_Do() {
	m, err := lock.NewMutex(memstore.New(), lock.WithTTL(5*time.Second))
	if err != nil {
		panic(err)
	}
	err = m.Do(context.Background(), "report:daily", func(ctx context.Context, l lock.Lease) error {
		// Long work here; stop when ctx is done. Pass l.Fence() to writes.
		fmt.Println("running under a fence:", l.Fence() > 0)
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// running under a fence: true
	// err: <nil>
}

// The work's context ends for two reasons: the caller gave up, or the lease
// was lost (a paused process, an unreachable store). context.Cause tells
// them apart; WithWaitTimeout bounds the wait for the key apart from the
// work's own deadline.
func ExampleMutex_Do_lossOrCancel() {
	store := memstore.New()
	m, err := lock.NewMutex(store, lock.WithTTL(50*time.Millisecond), lock.WithWaitTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	err = m.Do(context.Background(), "job:7", func(ctx context.Context, l lock.Lease) error {
		// An operator frees the key under the holder (oncectl lock release --force).
		if _, err := store.ForceRelease(context.Background(), "job:7"); err != nil {
			return err
		}
		<-ctx.Done()
		if context.Cause(ctx) == lock.ErrLockLost {
			fmt.Println("lost the lock: stop writing")
			return nil
		}
		return ctx.Err() // the caller cancelled
	})
	fmt.Println(errors.Is(err, lock.ErrLockLost))
	// Output:
	// lost the lock: stop writing
	// true
}

// A resource refuses writes from a holder whose lease has been superseded.
func ExampleFenceGate() {
	var gate lock.FenceGate
	fmt.Println(gate.Admit("stock:phone", 7)) // the current holder writes
	fmt.Println(gate.Admit("stock:phone", 8)) // a newer holder writes
	err := gate.Admit("stock:phone", 7)       // the old holder wakes up late
	fmt.Println(errors.Is(err, lock.ErrStaleFence), err)
	// Output:
	// <nil>
	// <nil>
	// true lock: stale fence 7 for "stock:phone": 8 already admitted
}

// AcquireAll reserves several keys at once; callers asking for the same
// keys in another order cannot deadlock.
func ExampleAcquireAll() {
	ctx := context.Background()
	locker := memstore.New()
	m, err := lock.AcquireAll(ctx, locker, []string{"sku:case", "sku:phone", "sku:case"}, time.Minute)
	if err != nil {
		fmt.Println("acquire:", err)
		return
	}
	defer m.Release(ctx)
	fmt.Println(m.Keys())
	// Output: [sku:case sku:phone]
}
