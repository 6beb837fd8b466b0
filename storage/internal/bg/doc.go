// Package bg tracks a driver's background work (requests a caller stopped
// waiting for, their clean-up) so that Close can wait for it.
package bg
