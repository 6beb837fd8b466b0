//go:build race

package locktest

// raceEnabled: the race detector slows code two to ten times; the suite's
// few time bounds on fairness stretch with it.
const raceEnabled = true
