package zkstore

import "github.com/go-zookeeper/zk"

// RecordPath is the znode of key's record (the tests plant foreign records
// there).
func RecordPath(s *Store, key string) string { return s.recordPath(key) }

// LockDir is the znode under which key's queue lives.
func LockDir(s *Store, key string) string { return s.lockDir(key) }

// StallPings makes the liveness clock's requests hang until release is
// closed, as behind a send blocked in a large write.
func StallPings(s *Store, release <-chan struct{}) {
	stalled := pingFunc(func(string) (bool, *zk.Stat, error) {
		<-release
		return false, nil, zk.ErrConnectionClosed
	})
	s.ping.Store(&stalled)
}

// CachedVersions is how many claims' record versions s remembers.
func CachedVersions(s *Store) int { return s.versions.size() }

// StockItemPath is the znode of item's stock.
func StockItemPath(s *Store, item string) string { return s.stockItem(item) }

// Escape is a key's znode name.
func Escape(key string) string { return escape(key) }
