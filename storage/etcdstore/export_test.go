package etcdstore

// RecordDir is the directory of key's record entries (the tests plant
// golden records there).
func RecordDir(s *Store, key string) string { return s.recordDir(key) }

// LockPrefix is the prefix of key's lock entries.
func LockPrefix(s *Store, key string) string { return s.lockPrefix(key) }
