package redisstore_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/storage/internal/layouts"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/internal/rediskit/layouttest"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// The records and locks that released versions wrote (testdata/layouts,
// one file per version) are judged by this version as they were meant:
// a claim in flight is not taken over, a completed record replays, a
// record of a layout this version does not read is left alone. A change
// of layout that would break a rolling deploy fails here.
func TestStoredLayouts(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	names := layouttest.Names{Keys: rediskit.Keys{Prefix: "layout:lock:"}, Records: rediskit.Records{Prefix: "layout:idem:"}}
	store := newStore(t, c, redisstore.WithPrefix(names.Keys.Prefix), redisstore.WithRecordPrefix(names.Records.Prefix))
	if layouts.Writing() {
		layouttest.Write(t, "testdata/layouts/v0.1.0.json", store, c, names)
	}
	layouts.Check(t, "testdata/layouts", store, layouttest.Plant([]*redis.Client{c}, names))
}
