package redlockstore_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/internal/layouts"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/internal/rediskit/layouttest"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

// The records and locks that released versions wrote on every node
// (testdata/layouts, one file per version) are judged by this version as
// they were meant; a change of layout that would break a rolling deploy
// fails here.
func TestStoredLayouts(t *testing.T) {
	t.Parallel()
	cs := clients(t, testenv.RedisAddrs(t, 3)[:3])
	nodes := make([]*redis.Client, len(cs))
	for i, c := range cs {
		nodes[i] = c.(*redis.Client)
	}
	names := layouttest.Names{Keys: rediskit.Keys{Prefix: "layout:redlock:"}, Records: rediskit.Records{Prefix: "layout:redlock-idem:"}}
	store := newStore(t, cs, redlockstore.WithPrefix(names.Keys.Prefix), redlockstore.WithRecordPrefix(names.Records.Prefix))
	if layouts.Writing() {
		layouttest.Write(t, "testdata/layouts/v0.1.0.json", store, nodes[0], names)
	}
	layouts.Check(t, "testdata/layouts", store, layouttest.Plant(nodes, names))
}
