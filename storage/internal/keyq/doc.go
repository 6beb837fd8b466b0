// Package keyq is a per-key FIFO mutex for the goroutines of one process:
// drivers put it in front of a distributed lock so that, of all the
// goroutines of a process waiting for one key, only the first talks to the
// servers.
package keyq
