// Package idemtest is the conformance suite every idemdriver.Store runs:
//
//	idemtest.Run(t, idemtest.Config{
//		NewStore: func(t *testing.T) idemdriver.Store { return store },
//	})
//
// It drives the stores through idem.Guard as well as directly, and sleeps
// only where expiry is the behaviour under test. BeforeBegin wraps a
// Store for tests of what calls it: a hook at the moment a claim is on
// its way to the store.
package idemtest
