// Package stocktest is the conformance suite every store that keeps stock
// (stockdriver.Store) runs: the same answers for the same operations on
// every store, no unit oversold or lost under concurrency, holds that end
// exactly once, and worker processes killed mid-take and mid-hold.
//
//	func TestStock(t *testing.T) {
//		stocktest.Run(t, stocktest.Config{NewStore: func(t *testing.T) stockdriver.Store { return newStore(t) }})
//	}
package stocktest
