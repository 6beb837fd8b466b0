package lock_test

import (
	"reflect"
	"testing"

	"github.com/oncekit/oncekit/core/lock"
)

// A Held does not hand out the driver's lease: a Release through it would
// bypass the watchdog, which would then report a loss that was not one. No
// method of Held returns a Lease.
func TestHeldHidesDriverLease(t *testing.T) {
	typ := reflect.TypeFor[lock.Held]()
	lease := reflect.TypeFor[lock.Lease]()
	for i := range typ.NumMethod() {
		m := typ.Method(i)
		for j := range m.Type.NumOut() {
			if out := m.Type.Out(j); out.Implements(lease) || out.Kind() == reflect.Slice && out.Elem().Implements(lease) {
				t.Errorf("lock.Held.%s returns %s: the driver's lease is reachable", m.Name, out)
			}
		}
	}
}
