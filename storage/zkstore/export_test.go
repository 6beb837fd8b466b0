package zkstore

// RecordPath is the znode of key's record (the tests plant foreign records
// there).
func RecordPath(s *Store, key string) string { return s.recordPath(key) }

// LockDir is the znode under which key's queue lives.
func LockDir(s *Store, key string) string { return s.lockDir(key) }
