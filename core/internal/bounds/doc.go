// Package bounds is the one owner of the bounds every oncekit package
// checks — a key's length, a TTL's minimum, an owner's length, and how
// long clean-up may run after its caller's context ended — and of the
// errors that report them. Package lock re-exports the bounds and errors
// users see (lock.MaxKeyLen, lock.ErrInvalidKey, …); package lockdriver
// and package idem check through here, so every check says the same.
package bounds
