package zkstore

// RecordPath is the znode of key's record (the tests plant foreign records
// there).
func RecordPath(s *Store, key string) string { return s.recordPath(key) }
