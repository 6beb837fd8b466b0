package testenv

import (
	"testing"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
)

// CheckRunEndsWhenCut runs a Guard over via, a Store whose connection goes
// through p, and cuts that connection (p.Stall) in the middle of the run,
// after its first extension: the run's context must be done before a
// Store of another process (other, connected directly) can claim the key
// (idemtest.CheckRunEndsBeforeAnother).
func CheckRunEndsWhenCut(t *testing.T, via, other idemdriver.Store, p *Proxy) {
	t.Helper()
	defer p.Resume() // before the run's clean-up, which needs the store
	idemtest.CheckRunEndsBeforeAnother(t, via, other, p.Stall)
}
