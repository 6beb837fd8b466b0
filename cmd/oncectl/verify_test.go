package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage"
	"github.com/oncekit/oncekit/storage/driver"
)

// TestMain makes the test binary a verify worker when verify starts it
// (verify runs its own executable), after registering the broken store
// the tests need in the workers too.
func TestMain(m *testing.M) {
	driver.Register(driver.Info{
		Package: "secondholder (oncectl's tests only)",
		Schemes: []string{"test-second-holder"},
		Usage:   "  test-second-holder://host:port                 oncectl's tests only: a Redis store that hands held keys to a second holder",
		Open:    openSecondHolder,
	})
	quietRedisLog()
	if cfg := os.Getenv(verifyWorkerEnv); cfg != "" {
		os.Exit(runVerifyWorker(cfg, os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// secondHolderStore is a BROKEN store, for TestVerifyFindsSecondHolder
// only: every other acquisition takes a shadow key instead of the key
// asked for, so two processes can hold one key at once.
type secondHolderStore struct {
	driver.Store
	n atomic.Int64
}

func openSecondHolder(ctx context.Context, u *driver.URL) (driver.Store, error) {
	s, err := storage.Open(ctx, "redis://"+u.Host, storage.WithTimeout(u.Timeout))
	if err != nil {
		return nil, err
	}
	return &secondHolderStore{Store: s}, nil
}

func (s *secondHolderStore) key(key string) string {
	if s.n.Add(1)%2 == 0 {
		return key + "#second-holder"
	}
	return key
}

func (s *secondHolderStore) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	return s.Store.Acquire(ctx, s.key(key), ttl)
}

func (s *secondHolderStore) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	return s.Store.TryAcquire(ctx, s.key(key), ttl)
}

// runVerify runs verify on store and returns its exit status and report.
func runVerify(t *testing.T, store string, args ...string) (int, verifyReport, string) {
	t.Helper()
	html := t.TempDir() + "/verify.html"
	args = append([]string{"--store", store, "--json", "verify", "--html", html}, args...)
	code, out, errOut := oncectl(t, "", args...)
	var r verifyReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("verify --json: exit %d, %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
	}
	page, err := os.ReadFile(html)
	if err != nil || !strings.Contains(string(page), "<svg") {
		t.Errorf("verify --html wrote no page with pictures: %v", err)
	}
	return code, r, out
}

// verify passes on every store make test runs: no overlapping holds,
// fences that grow, every duplicate the first answer, a linearizable
// history, and the killed worker's key freed.
func TestVerify(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
		args []string
	}{
		{"redis", func(t *testing.T) string { return "redis://" + testenv.RedisAddrs(t, 1)[0] }, nil},
		{"redis-cluster", func(t *testing.T) string {
			return "redis-cluster://" + strings.Join(testenv.RedisClusterAddrs(t), ",")
		}, nil},
		{"redis-sentinel", func(t *testing.T) string {
			sentinels, master := testenv.SentinelAddrs(t)
			return "redis-sentinel://" + strings.Join(sentinels, ",") + "?master_name=" + master + "&replicas=1"
		}, nil},
		{"pgbouncer", func(t *testing.T) string {
			return withQuery(withQuery(testenv.PgBouncerURL(t), "notify", "false"), "default_query_exec_mode", "exec")
		}, nil},
		{"redlock", func(t *testing.T) string { return "redlock://" + strings.Join(testenv.RedisAddrs(t, 3)[:3], ",") }, nil},
		{"etcd", func(t *testing.T) string { return "etcd://" + strings.Join(testenv.EtcdAddrs(t), ",") }, nil},
		{"postgres", func(t *testing.T) string { return testenv.PostgresURL(t) }, nil},
		{"mysql", func(t *testing.T) string { return testenv.MySQLURL(t) }, nil},
		// A dead holder's key frees with its session, not the TTL: a
		// short session, and a run long enough for it to end.
		{"zk", func(t *testing.T) string {
			return "zk://" + strings.Join(testenv.ZooKeeperAddrs(t), ",") + "/oncectl-verify?session_timeout=2s"
		}, []string{"--for", "6s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--for", "3s", "--ttl", "1s", "--workers", "3"}, tc.args...)
			code, r, out := runVerify(t, tc.url(t), args...)
			if code != exitOK || !r.Pass {
				t.Fatalf("exit %d: %s", code, out)
			}
			if r.Holds == 0 || r.WritesOK == 0 || r.New == 0 || r.Replays == 0 || r.Linearizable != "ok" {
				t.Errorf("too little checked: %s", out)
			}
			if r.Killed == nil || r.Killed.Freed <= 0 {
				t.Errorf("no worker killed mid-hold, or its key never freed: %s", out)
			}
		})
	}
}

// verify finds two holders of one key on a store made to hand one out.
func TestVerifyFindsSecondHolder(t *testing.T) {
	code, r, out := runVerify(t, "test-second-holder://"+testenv.RedisAddrs(t, 1)[0], "--for", "3s", "--ttl", "1s")
	if code != exitFail || r.Pass || r.Overlaps == 0 {
		t.Fatalf("exit %d, want 1 with overlapping holds: %s", code, out)
	}
	if !strings.Contains(strings.Join(r.Failures, " "), "held a key at once") {
		t.Errorf("failures do not name the overlap: %v", r.Failures)
	}
}

// The history checker refuses a key answered twice.
func TestCheckClaims(t *testing.T) {
	ok := []*vclaim{
		{worker: "a", key: "k", proposal: "a1", answer: "a1", call: 1, ret: 5, done: true},
		{worker: "b", key: "k", proposal: "b1", answer: "a1", call: 2, ret: 6, done: true, replay: true},
		{worker: "c", key: "j", proposal: "c1", call: 2}, // died: may have run
		{worker: "a", key: "j", proposal: "a2", answer: "c1", call: 7, ret: 8, done: true, replay: true},
	}
	if got := checkClaims(ok, 10); got != "ok" {
		t.Errorf("a legal history: %s", got)
	}
	twice := []*vclaim{
		{worker: "a", key: "k", proposal: "a1", answer: "a1", call: 1, ret: 2, done: true},
		{worker: "b", key: "k", proposal: "b1", answer: "b1", call: 3, ret: 4, done: true},
	}
	if got := checkClaims(twice, 10); got != "illegal" {
		t.Errorf("a key run twice: %s", got)
	}
	stale := []*vclaim{
		{worker: "a", key: "k", proposal: "a1", answer: "a1", call: 1, ret: 2, done: true},
		{worker: "b", key: "k", proposal: "b1", answer: "", call: 3, ret: 4, done: true, replay: true},
	}
	if got := checkClaims(stale, 10); got != "illegal" {
		t.Errorf("a replay of nothing after the key ran: %s", got)
	}
}

// Holds at once with both writes accepted are overlaps; fences that do not
// grow across holds one after the other are found.
func TestJudgeHolds(t *testing.T) {
	overlaps, fenced, back, _ := judgeHolds([]*vhold{
		{Worker: "a", Key: "k", Fence: 1, From: 0, To: 10, Wrote: true},
		{Worker: "b", Key: "k", Fence: 2, From: 5, To: 15, Wrote: true},    // at once with a: overlap
		{Worker: "c", Key: "k", Fence: 3, From: 12, To: 20, Refused: true}, // at once with b, fenced off
		{Worker: "a", Key: "k", Fence: 2, From: 30, To: 40, Wrote: true},   // after b (fence 2): back
		{Worker: "a", Key: "j", Fence: 1, From: 0, To: 10, Wrote: true},    // another key
	})
	if overlaps != 1 || fenced != 1 || back != 1 {
		t.Errorf("overlaps %d, fenced %d, back %d; want 1, 1, 1", overlaps, fenced, back)
	}
}
