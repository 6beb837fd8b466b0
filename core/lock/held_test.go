package lock_test

import (
	"reflect"
	"testing"

	"github.com/oncekit/oncekit/core/lock"
)

// A Held does not hand out the driver's lease: a Release through it would
// bypass the watchdog, which would then report a loss that was not one.
func TestHeldHidesDriverLease(t *testing.T) {
	typ := reflect.TypeFor[lock.Held]()
	lease := reflect.TypeFor[lock.Lease]()
	for i := range typ.NumField() {
		if f := typ.Field(i); f.IsExported() && f.Type.Implements(lease) {
			t.Errorf("lock.Held exports field %s of type %s: the driver's lease is reachable", f.Name, f.Type)
		}
	}
}
