// Package ctxbound holds the contexts clean-up runs under — bounded by a
// deadline, free of their caller's cancellation — and the one timer that
// ends them and the leases of package lockdriver at their deadlines. The
// core (idem) and the driver kit (lockdriver, which exports them to
// drivers) share it.
package ctxbound
