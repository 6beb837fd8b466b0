// Package redisnotify wakes waiters when a Redis lock is released: it
// multiplexes the release channels of many waiting Acquires over one
// pub/sub connection per Redis shard.
package redisnotify
