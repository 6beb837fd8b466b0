package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Required reports whether missing servers are a failure rather than a skip.
func Required() bool { return os.Getenv("ONCEKIT_REQUIRE_SERVERS") == "1" }

// RedisAddrs returns at least n Redis addresses from REDIS_ADDRS, or skips
// (fails, under ONCEKIT_REQUIRE_SERVERS=1) the test.
func RedisAddrs(tb testing.TB, n int) []string {
	tb.Helper()
	return addrs(tb, "REDIS_ADDRS", n)
}

// RedisClusterAddrs returns the seed addresses of the test Redis Cluster
// from REDIS_CLUSTER_ADDRS, or skips (fails under ONCEKIT_REQUIRE_SERVERS=1).
func RedisClusterAddrs(tb testing.TB) []string {
	tb.Helper()
	return addrs(tb, "REDIS_CLUSTER_ADDRS", 1)
}

// ZooKeeperAddrs returns the test ZooKeeper ensemble's client addresses
// from ZOOKEEPER_ADDRS, or skips (fails under ONCEKIT_REQUIRE_SERVERS=1).
func ZooKeeperAddrs(tb testing.TB) []string {
	tb.Helper()
	return addrs(tb, "ZOOKEEPER_ADDRS", 1)
}

func addrs(tb testing.TB, env string, n int) []string {
	tb.Helper()
	var out []string
	for a := range strings.SplitSeq(os.Getenv(env), ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	if len(out) >= n {
		return out
	}
	msg := env + " names fewer than the servers this test needs (run `make services-up` and export the variables it prints, or use `make test`)"
	if Required() {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
	return nil
}

// Addrs returns the addresses listed in env (comma-separated), for code
// that runs without a testing.TB: a holder process of locktest.
func Addrs(env string) []string {
	var out []string
	for a := range strings.SplitSeq(os.Getenv(env), ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// HolderAddrs returns the first n addresses listed in env, or an error
// naming env when it lists fewer: for a holder process of locktest, which
// inherits its parent's environment and has no testing.TB to skip.
func HolderAddrs(env string, n int) ([]string, error) {
	a := Addrs(env)
	if len(a) < n {
		return nil, fmt.Errorf("%s lists %d addresses, the holder process needs %d", env, len(a), n)
	}
	return a[:n], nil
}

// skipShort skips a test that starts servers of its own (to stop, pause
// and restart them) under go test -short: the quick run, which make
// test's pass without configured servers is. The race pass runs them.
func skipShort(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("starts servers of its own: not with -short")
	}
}

// NeedCommand skips tb (fails it under ONCEKIT_REQUIRE_SERVERS=1) unless
// the named program is installed.
func NeedCommand(tb testing.TB, name string) {
	tb.Helper()
	if _, err := exec.LookPath(name); err == nil {
		return
	}
	msg := name + " is not installed (make services-up installs it)"
	if Required() {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
}

// PostgresURL returns the test PostgreSQL server's URL from POSTGRES_URL
// (postgres://user@host:port/db?sslmode=disable), or skips (fails under
// ONCEKIT_REQUIRE_SERVERS=1).
func PostgresURL(tb testing.TB) string {
	tb.Helper()
	return addrs(tb, "POSTGRES_URL", 1)[0]
}

// PgBouncerURL returns the URL of pgbouncer in transaction pooling mode in
// front of the test PostgreSQL server, from PGBOUNCER_URL, or skips (fails
// under ONCEKIT_REQUIRE_SERVERS=1).
func PgBouncerURL(tb testing.TB) string {
	tb.Helper()
	return addrs(tb, "PGBOUNCER_URL", 1)[0]
}

// MySQLURL returns the test MariaDB/MySQL server's URL from MYSQL_URL
// (mysql://user[:password]@host:port/db), or skips (fails under
// ONCEKIT_REQUIRE_SERVERS=1).
func MySQLURL(tb testing.TB) string {
	tb.Helper()
	return addrs(tb, "MYSQL_URL", 1)[0]
}
