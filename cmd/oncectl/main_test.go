package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/internal/testenv"
)

// oncectl runs the command line and returns its exit status and output.
func oncectl(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func randKey(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// The same scenario on every driver, against the real servers: a process
// holds a lock and completes a request; oncectl inspects both, and frees the
// lock and deletes the record.
func TestAgainstRealServers(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"redis", func(t *testing.T) string { return "redis://" + testenv.RedisAddrs(t, 1)[0] + "/0" }},
		{"redis-cluster", func(t *testing.T) string {
			return "redis-cluster://" + strings.Join(testenv.RedisClusterAddrs(t), ",")
		}},
		{"redlock", func(t *testing.T) string {
			return "redlock://" + strings.Join(testenv.RedisAddrs(t, 3)[:3], ",") + "?prefix=oncectl-test:"
		}},
		{"etcd", func(t *testing.T) string {
			return "etcd://" + strings.Join(testenv.EtcdAddrs(t), ",") + "?prefix=oncectl-test/lock/&record_prefix=oncectl-test/idem/"
		}},
		{"postgres", func(t *testing.T) string { return testenv.PostgresURL(t) }},
		{"mysql", func(t *testing.T) string { return testenv.MySQLURL(t) }},
		{"zk", func(t *testing.T) string {
			return "zk://" + strings.Join(testenv.ZooKeeperAddrs(t), ",") + "/oncectl-test"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { scenario(t, tc.url(t)) })
	}
}

func scenario(t *testing.T, url string) {
	// (The scenario's own calls share this; the record listings scan the
	// whole shared store, which other packages' tests fill.)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if code, out, errOut := oncectl(t, "", "ping", "--store", url); code != exitOK || !strings.HasPrefix(out, "ok") {
		t.Fatalf("ping: exit %d, %q %q", code, out, errOut)
	}
	// The "application": a store opened the same way, holding a lock.
	app, err := openStore(url, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer app.close()
	locker := app.store.(lock.Locker)
	key := randKey("sku-")
	held, err := locker.Acquire(ctx, key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}

	code, out, errOut := oncectl(t, "", "lock", "inspect", key, "--store", url, "--json")
	if code != exitOK {
		t.Fatalf("lock inspect: exit %d: %s", code, errOut)
	}
	var li lockJSON
	if err := json.Unmarshal([]byte(out), &li); err != nil {
		t.Fatalf("lock inspect --json: %v: %s", err, out)
	}
	// Redis reports the last fence of the holder's range, Redlock the
	// highest among its nodes: at least the holder's (lockdriver.LockInfo.Fence).
	fenceOK := li.Fence == held.Fence() || ((strings.HasPrefix(url, "redis") || strings.HasPrefix(url, "redlock")) && li.Fence > held.Fence())
	if !li.Held || li.Token != lockdriver.TokenPrefix(held.Token()) || !fenceOK || li.TTLms <= 0 || li.Key != key {
		t.Errorf("lock inspect = %+v; want held by %s with fence %d", li, lockdriver.TokenPrefix(held.Token()), held.Fence())
	}
	code, out, _ = oncectl(t, "", "--store", url, "lock", "inspect", key)
	if code != exitOK || !regexp.MustCompile(`held\s+yes`).MatchString(out) || !strings.Contains(out, lockdriver.TokenPrefix(held.Token())) {
		t.Errorf("lock inspect table (exit %d):\n%s", code, out)
	}

	if code, _, errOut := oncectl(t, "", "--store", url, "lock", "release", key); code != exitUsage || !strings.Contains(errOut, "--force") {
		t.Errorf("release without --force: exit %d: %s", code, errOut)
	}
	if code, _, errOut := oncectl(t, "n\n", "--store", url, "lock", "release", key, "--force"); code != exitFail ||
		!strings.Contains(errOut, "Release "+key) || !strings.Contains(errOut, "not released") {
		t.Errorf("release declined: exit %d: %s", code, errOut)
	}
	if err := held.Refresh(ctx, 30*time.Second); err != nil {
		t.Fatalf("the holder lost its lock although the release was declined: %v", err)
	}
	if code, out, errOut := oncectl(t, "y\n", "--store", url, "lock", "release", key, "--force"); code != exitOK {
		t.Fatalf("release confirmed: exit %d: %s %s", code, out, errOut)
	}
	if err := held.Refresh(ctx, 30*time.Second); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("the forced-out holder's Refresh: %v, want ErrLockLost", err)
	}
	other, err := openStore(url, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer other.close()
	next, err := other.store.(lock.Locker).TryAcquire(ctx, key, time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after the forced release: %v", err)
	}
	_ = next.Release(ctx)

	// A completed request, scoped to a tenant.
	g, err := idem.NewGuard(app.store.(idemdriver.Store))
	if err != nil {
		t.Fatal(err)
	}
	req := randKey("req-")
	if _, _, err := g.Do(ctx, idemdriver.ScopedKey("tenant-1", req), "fp-1", func(context.Context) ([]byte, error) {
		return []byte(`{"order":42}`), nil
	}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = oncectl(t, "", "--store", url, "record", "get", req, "--scope", "tenant-1", "--json")
	if code != exitOK {
		t.Fatalf("record get: exit %d: %s", code, errOut)
	}
	var rj recordJSON
	if err := json.Unmarshal([]byte(out), &rj); err != nil {
		t.Fatal(err)
	}
	if !rj.Found || rj.State != "completed" || rj.Result != `"{\"order\":42}"` || rj.ResultBytes != 12 || rj.Fingerprint != "fp-1" || rj.Expires == "" {
		t.Errorf("record get = %+v", rj)
	}
	if code, out, _ := oncectl(t, "", "--store", url, "record", "get", "--stored", idemdriver.ScopedKey("tenant-1", req)); code != exitOK ||
		!regexp.MustCompile(`state\s+completed`).MatchString(out) {
		t.Errorf("record get --stored (exit %d):\n%s", code, out)
	}
	if code, out, _ := oncectl(t, "", "--store", url, "record", "get", req); code != exitOK || !regexp.MustCompile(`found\s+no`).MatchString(out) {
		t.Errorf("record get without the scope finds another key (exit %d):\n%s", code, out)
	}
	// A claim left in flight (a run stuck, or still going) is listed with
	// --in-flight; the completed record is not.
	stuck := idemdriver.ScopedKey("tenant-1", randKey("stuck-"))
	if c, err := app.store.(idemdriver.Store).Begin(ctx, idemdriver.MustKey(stuck), "fp", time.Minute); err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", c.State, err)
	}
	listed := func(args ...string) map[string]string {
		t.Helper()
		code, out, errOut := oncectl(t, "", append([]string{"--store", url, "record", "list", "--json", "--limit", "100000", "--timeout", "60s"}, args...)...)
		if code != exitOK {
			t.Fatalf("record list %v: exit %d: %s", args, code, errOut)
		}
		var rs []recordJSON
		if err := json.Unmarshal([]byte(out), &rs); err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, r := range rs {
			m[r.Key] = r.State
		}
		return m
	}
	if all := listed(); all[stuck] != "in_flight" || all[idemdriver.ScopedKey("tenant-1", req)] != "completed" {
		t.Errorf("record list: the stuck claim %q and the completed record %q", all[stuck], all[idemdriver.ScopedKey("tenant-1", req)])
	}
	if stuckOnly := listed("--in-flight"); stuckOnly[stuck] != "in_flight" || stuckOnly[idemdriver.ScopedKey("tenant-1", req)] != "" {
		t.Errorf("record list --in-flight: %v", stuckOnly)
	}
	if code, out, _ := oncectl(t, "", "--store", url, "record", "list", "--in-flight", "--limit", "100000", "--timeout", "60s"); code != exitOK || !strings.Contains(out, "in flight") {
		t.Errorf("record list --in-flight as a table (exit %d):\n%s", code, out)
	}
	if code, _, errOut := oncectl(t, "", "--store", url, "record", "delete", req, "--scope", "tenant-1"); code != exitFail || !strings.Contains(errOut, "not deleted") {
		t.Errorf("record delete without an answer: exit %d: %s", code, errOut)
	}
	if code, out, errOut := oncectl(t, "", "--store", url, "record", "delete", req, "--scope", "tenant-1", "--yes"); code != exitOK {
		t.Fatalf("record delete --yes: exit %d: %s %s", code, out, errOut)
	}
	ran := false
	if _, replayed, err := g.Do(ctx, idemdriver.ScopedKey("tenant-1", req), "fp-1", func(context.Context) ([]byte, error) {
		ran = true
		return nil, nil
	}); err != nil || replayed || !ran {
		t.Errorf("after record delete the request did not run again: ran %v replayed %v err %v", ran, replayed, err)
	}
}

// Bad input and unreachable stores get a clear error and the right status,
// before or without touching a store.
func TestErrors(t *testing.T) {
	testenv.QuietRedisDialErrors()
	long := strings.Repeat("k", lock.MaxKeyLen+1)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "Usage:"},
		{[]string{"lock"}, exitUsage, "want a command"},
		{[]string{"lock", "steal", "k"}, exitUsage, "unknown command"},
		{[]string{"lock", "inspect", ""}, exitUsage, "invalid key"},
		{[]string{"lock", "inspect", long}, exitUsage, "invalid key"},
		{[]string{"lock", "inspect", "k", "--bogus"}, exitUsage, "flag provided but not defined"},
		{[]string{"lock", "inspect", "k", "--timeout", "-1s"}, exitUsage, "--timeout"},
		{[]string{"record", "get", "k", "--scope", "s", "--stored"}, exitUsage, "exclude"},
		{[]string{"lock", "inspect", "k", "--store", ""}, exitFail, "no store"},
		{[]string{"lock", "inspect", "k", "--store", "memory://"}, exitFail, "inside one process"},
		{[]string{"lock", "inspect", "k", "--store", "mongodb://db"}, exitFail, `scheme "mongodb" is not supported`},
		{[]string{"lock", "inspect", "k", "--store", "mysql://db"}, exitFail, "no database name"},
		{[]string{"lock", "inspect", "k", "--store", "localhost:6379"}, exitFail, "no scheme"},
		{[]string{"lock", "inspect", "k", "--store", "redlock://"}, exitFail, "names no host"},
		{[]string{"lock", "inspect", "k", "--store", "redlock://127.0.0.1:1,127.0.0.1:2"}, exitFail, "odd number"},
		{[]string{"lock", "inspect", "k", "--store", "redis://127.0.0.1:1", "--timeout", "500ms"}, exitFail, "connection refused"},
		{[]string{"record", "get", "k", "--store", "etcd://127.0.0.1:1", "--timeout", "500ms"}, exitFail, "etcdstore: inspect record"},
		{[]string{"record", "get", "k", "--store", "zk://127.0.0.1:1", "--timeout", "500ms"}, exitFail, "zkstore: connect"},
		{[]string{"ping", "--store", "redis://127.0.0.1:1", "--timeout", "500ms"}, exitFail, "redisstore: ping"},
		{[]string{"ping", "extra", "--store", "redis://127.0.0.1:1"}, exitUsage, "ping takes no argument"},
		{[]string{"record", "list", "--limit", "0"}, exitUsage, "--limit"},
		{[]string{"--", "lock", "inspect", "-k", "--store", "redis://127.0.0.1:1"}, exitUsage, "want a command"},
	} {
		t.Setenv("ONCEKIT_STORE", "")
		code, _, errOut := oncectl(t, "", tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("oncectl %q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	if code, out, _ := oncectl(t, "", "--help"); code != exitOK || !strings.Contains(out, "redlock://") {
		t.Errorf("--help: exit %d:\n%s", code, out)
	}
}

// The key flags derive the stored key as each middleware does; bad
// combinations are usage errors.
func TestRecordKeyFlags(t *testing.T) {
	placed, _ := idem.Placed("tv-1", idemdriver.ScopedKey("user:ann", "k1"))
	for _, tc := range []struct {
		cli  cli
		want string
	}{
		{cli{}, idemdriver.ScopedKey("", "k1")},
		{cli{scope: "user:ann"}, idemdriver.ScopedKey("user:ann", "k1")},
		{cli{scope: "user:ann", method: "/shop.Orders/Place"}, idemdriver.ScopedKey("user:ann", "/shop.Orders/Place\nk1")},
		{cli{group: "shipping", topic: "order.created"}, idemdriver.ScopedKey("kafka\x00shipping\x00order.created", "k1")},
		{cli{scope: "user:ann", place: "tv-1"}, placed},
		{cli{stored: true}, "k1"},
	} {
		if got, err := tc.cli.recordKey("k1"); err != nil || got != tc.want {
			t.Errorf("%+v: %q %v, want %q", tc.cli, got, err, tc.want)
		}
	}
	for _, bad := range []cli{
		{stored: true, scope: "s"}, {stored: true, place: "p"}, {group: "g"}, {topic: "t"},
		{group: "g", topic: "t", scope: "s"}, {group: "g", topic: "t", method: "/a/b"}, {place: "a}b"},
	} {
		if got, err := bad.recordKey("k1"); err == nil {
			t.Errorf("%+v: %q, want an error", bad, got)
		}
	}
	if code, out, _ := oncectl(t, "", "version"); code != exitOK || !strings.HasPrefix(out, "oncekit oncectl v0.1.0 ") || !strings.Contains(out, "go1.") {
		t.Errorf("version: exit %d %q", code, out)
	}
	if code, _, errOut := oncectl(t, "", "record", "get", "k", "--kafka-group", "g", "--store", "redis://127.0.0.1:1"); code != exitUsage || !strings.Contains(errOut, "go together") {
		t.Errorf("--kafka-group alone: exit %d %q", code, errOut)
	}
}
