// Package testenv finds the real servers that tests run against.
//
// Servers are named by environment variables (REDIS_ADDRS, a comma-separated
// list of host:port). When a variable is unset a test skips, so that a plain
// `go test ./...` works on a laptop; when ONCEKIT_REQUIRE_SERVERS=1 (as
// `make test` sets it) a missing server fails the test instead.
package testenv
