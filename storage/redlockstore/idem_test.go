package redlockstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/internal/testenv"
)

func TestIdemConformance(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	idemtest.Run(t, idemtest.Config{
		NewStore:     func(t *testing.T) idem.Store { return newStore(t, clients(t, addrs)) },
		FenceAtLeast: true, // each node keeps its own fence
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
