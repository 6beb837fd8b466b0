// Package locktest is the conformance suite every lock.Locker driver runs.
// Each promise of the lock.Locker and lock.Lease contracts is a named
// subtest, so a driver that breaks one fails by name:
//
//	func TestConformance(t *testing.T) {
//		store := memstore.New()
//		locktest.Run(t, locktest.Config{
//			NewLocker: func(t *testing.T) lock.Locker { return store },
//		})
//	}
//
// The suite uses real time: it sleeps where expiry is the behaviour under
// test, with TTLs of 100-300 ms, and takes a few seconds per driver.
package locktest
