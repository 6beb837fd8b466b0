package zkstore

import (
	"sync"
	"sync/atomic"
	"time"
)

// versionCache remembers the version of each record this Store last wrote
// for a claim it holds (by token), so that Complete and Extend write in
// one round trip; a stale or missing one costs a read and a retry. An
// entry goes when its claim finishes or is found lost, and an entry whose
// claim nobody finished (its caller gave up on it) goes a minute after its
// lease ended: the cache never grows with claims no longer held.
type versionCache struct {
	m      sync.Map // token -> cachedVersion
	stores atomic.Uint64
}

type cachedVersion struct {
	version int32
	until   time.Time // the claim's lease, and a minute
}

// forgetAfter is how long past its lease an unfinished claim's entry stays.
const forgetAfter = time.Minute

func (c *versionCache) load(tok string) (int32, bool) {
	v, ok := c.m.Load(tok)
	if !ok {
		return 0, false
	}
	return v.(cachedVersion).version, true
}

// store remembers version for tok, whose lease runs lease from now; every
// 256th call drops the entries past their time.
func (c *versionCache) store(tok string, version int32, lease time.Duration) {
	now := time.Now()
	c.m.Store(tok, cachedVersion{version, now.Add(lease + forgetAfter)})
	if c.stores.Add(1)%256 == 0 {
		c.m.Range(func(k, v any) bool {
			if now.After(v.(cachedVersion).until) {
				c.m.Delete(k)
			}
			return true
		})
	}
}

func (c *versionCache) forget(tok string) { c.m.Delete(tok) }

// size is the number of entries, for tests.
func (c *versionCache) size() int {
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	return n
}
