package rediskit

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// Warm opens n connections of c's pool (of each primary's, on a Cluster)
// and hands them back idle, so that the first burst of requests finds
// them open; n ≤ 0 opens as many as the pool holds (go-redis' PoolSize).
// A client that is not go-redis' *redis.Client or *redis.ClusterClient
// (a wrapper of the caller's) is left as it is. It returns the first
// error a connection met; those opened before it stay open.
func Warm(ctx context.Context, c any, n int) error {
	switch c := c.(type) {
	case *redis.Client:
		return warmPool(ctx, c, n)
	case *redis.ClusterClient:
		return c.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
			return warmPool(ctx, shard, n)
		})
	}
	return nil
}

// warmPool holds n connections of c's pool at once, each asked a PING,
// then hands them all back: one by one, the pool would give the same
// connection each time.
func warmPool(ctx context.Context, c *redis.Client, n int) error {
	if size := c.Options().PoolSize; n <= 0 || n > size {
		n = size
	}
	conns := make([]*redis.Conn, 0, n)
	var errs error
	for range n {
		cn := c.Conn()
		conns = append(conns, cn)
		if err := cn.Ping(ctx).Err(); err != nil {
			errs = err
			break
		}
	}
	for _, cn := range conns {
		errs = errors.Join(errs, cn.Close())
	}
	return errs
}
