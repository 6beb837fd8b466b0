package main

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/testenv"
)

// verdicts runs doctor on store and returns its exit status and each
// promise's verdict, failing t on output that is not its JSON.
func verdicts(t *testing.T, store string, args ...string) (int, map[string]finding) {
	t.Helper()
	code, out, errOut := oncectl(t, "", append([]string{"--store", store, "--json", "doctor"}, args...)...)
	var d diagnosis
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("doctor --json: exit %d, %v\nstdout: %s\nstderr: %s", code, err, out, errOut)
	}
	m := map[string]finding{}
	for _, f := range d.Findings {
		m[f.Promise] = f
	}
	if len(d.Facts) == 0 {
		t.Errorf("doctor reported no facts: %s", out)
	}
	return code, m
}

// Each Redis hazard found on a server that has it, and none on one that
// has none.
func TestDoctorRedis(t *testing.T) {
	t.Run("durable", func(t *testing.T) {
		p := testenv.StartDurableRedis(t)
		code, v := verdicts(t, "redis://"+p.Addr)
		for promise, f := range v {
			if f.Verdict != holds {
				t.Errorf("%s: %s (%s), want holds on a server with appendfsync always and no eviction", promise, f.Verdict, f.Why)
			}
		}
		if code != exitOK {
			t.Errorf("exit %d, want 0", code)
		}
	})
	t.Run("no persistence", func(t *testing.T) {
		p := testenv.StartRedis(t)
		code, v := verdicts(t, "redis://"+p.Addr)
		if f := v[promiseExclusion]; f.Verdict != holdsIf || !strings.Contains(f.Why, "empty restart") || !strings.Contains(f.Fix, "appendonly yes") {
			t.Errorf("exclusion: %+v, want holds if not restarted, with the fix", f)
		}
		if f := v[promiseOnce]; f.Verdict != holdsIf {
			t.Errorf("runs once: %+v", f)
		}
		if code != exitOK {
			t.Errorf("exit %d, want 0 (every promise holds on its condition)", code)
		}
	})
	t.Run("evicting", func(t *testing.T) {
		p := testenv.StartDurableRedis(t)
		c := redis.NewClient(&redis.Options{Addr: p.Addr})
		defer c.Close()
		if err := c.ConfigSet(context.Background(), "maxmemory", "100mb").Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
			t.Fatal(err)
		}
		code, v := verdicts(t, "redis://"+p.Addr)
		for _, promise := range []string{promiseExclusion, promiseOnce, promiseRetry} {
			if f := v[promise]; f.Verdict != fails || !strings.Contains(f.Why, "allkeys-lru") || !strings.Contains(f.Fix, "noeviction") {
				t.Errorf("%s: %+v, want does not hold (allkeys-lru), with the fix", promise, f)
			}
		}
		if code != exitFail {
			t.Errorf("exit %d, want 1", code)
		}
	})
}

// The SQL hazards: synchronous_commit off, a transaction pooler, MariaDB's
// log flushed once a second (make test's own setting).
func TestDoctorSQL(t *testing.T) {
	t.Run("synchronous_commit off", func(t *testing.T) {
		u := withQuery(testenv.PostgresURL(t), "options", "-c synchronous_commit=off")
		_, v := verdicts(t, u)
		// make test's server runs with fsync off, the worse hazard, which
		// the verdict names first; the fact shows the session's setting.
		_, out, _ := oncectl(t, "", "--store", u, "doctor")
		if f := v[promiseOnce]; f.Verdict != holdsIf || !strings.Contains(f.Why, "synchronous_commit = off") || !strings.Contains(f.Fix, "synchronous_commit = on") {
			t.Errorf("runs once: %+v, want holds if, naming synchronous_commit and its fix", f)
		}
		if !strings.Contains(out, "/ off") {
			t.Errorf("doctor does not show synchronous_commit off:\n%s", out)
		}
	})
	t.Run("pgbouncer", func(t *testing.T) {
		u := testenv.PgBouncerURL(t) + "&notify=false&default_query_exec_mode=exec"
		if !strings.Contains(testenv.PgBouncerURL(t), "?") {
			u = testenv.PgBouncerURL(t) + "?notify=false&default_query_exec_mode=exec"
		}
		code, v := verdicts(t, u)
		if f := v[promiseExclusion]; strings.Contains(f.Why, "pooler") || code != exitOK {
			t.Errorf("behind pgbouncer with the URL it needs: exit %d, exclusion %+v", code, f)
		}
		// Without them pgx's named statements fail through the pooler:
		// doctor says so, and reads the rest with them.
		// (Whether doctor's own statements meet the failure is chance: it
		// says so when they do, and names the hazard when they do not.)
		_, v = verdicts(t, testenv.PgBouncerURL(t))
		if f := v[promiseExclusion]; f.Verdict == holds || !strings.Contains(f.Why, "prepared statement") || !strings.Contains(f.Fix, "default_query_exec_mode=exec") {
			t.Errorf("behind pgbouncer with the URL of a direct connection: exclusion %+v", f)
		}
		// With the statements unnamed but LISTEN left on, waiters miss
		// their wake-ups.
		code, v = verdicts(t, withQuery(testenv.PgBouncerURL(t), "default_query_exec_mode", "exec"))
		if f := v[promiseExclusion]; f.Verdict != holdsIf || !strings.Contains(f.Why, "LISTEN") || strings.Contains(f.Why, "prepared") || code != exitOK {
			t.Errorf("behind pgbouncer without notify=false: exit %d, exclusion %+v", code, f)
		}
		_, out, _ := oncectl(t, "", "--store", u, "doctor")
		if !strings.Contains(out, "transaction pooling") {
			t.Errorf("doctor behind pgbouncer does not name the pooler:\n%s", out)
		}
	})
	t.Run("mariadb flush", func(t *testing.T) {
		_, v := verdicts(t, testenv.MySQLURL(t))
		f := v[promiseOnce]
		if strings.Contains(f.Why, "innodb_flush_log_at_trx_commit = 2") != (f.Verdict == holdsIf) {
			t.Errorf("runs once: %+v", f)
		}
	})
}

// An unreachable store is exit 2 for doctor and verify, with the reason.
func TestDoctorVerifyUnreachable(t *testing.T) {
	for _, cmd := range []string{"doctor", "verify"} {
		code, _, errOut := oncectl(t, "", "--store", "redis://127.0.0.1:1", "--timeout", "500ms", cmd)
		if code != exitUsage || !strings.Contains(errOut, "127.0.0.1:1") {
			t.Errorf("%s on a closed port: exit %d, %s", cmd, code, errOut)
		}
	}
}

// A Redis Cluster: each primary judged, the shards without a replica
// named.
func TestDoctorCluster(t *testing.T) {
	code, v := verdicts(t, "redis-cluster://"+strings.Join(testenv.RedisClusterAddrs(t), ","))
	if code != exitOK {
		t.Errorf("exit %d, want 0", code)
	}
	if f := v[promiseOnce]; f.Verdict != holdsIf || !strings.Contains(f.Why, "without a replica") || !strings.Contains(f.Why, "every primary") {
		t.Errorf("runs once on make test's Cluster (no replicas, no persistence): %+v", f)
	}
}

// Sentinel: a failover without replica acknowledgement is named, with
// how soon one comes; replicas= in the URL answers it.
func TestDoctorSentinel(t *testing.T) {
	sentinels, master := testenv.SentinelAddrs(t)
	u := "redis-sentinel://" + strings.Join(sentinels, ",") + "?master_name=" + master
	code, v := verdicts(t, u)
	if f := v[promiseExclusion]; f.Verdict != holdsIf || !strings.Contains(f.Why, "acknowledges nothing") || !strings.Contains(f.Fix, "replicas=N") {
		t.Errorf("Sentinel without replicas=: exclusion %+v", f)
	}
	if code != exitOK {
		t.Errorf("exit %d", code)
	}
	_, v = verdicts(t, u+"&replicas=1")
	if f := v[promiseExclusion]; strings.Contains(f.Why, "acknowledges nothing") {
		t.Errorf("Sentinel with replicas=1: exclusion %+v", f)
	}
}

// A user without a right the driver needs: every promise that rests on
// the driver's requests does not hold, and the command is named.
func TestDoctorRedisRights(t *testing.T) {
	p := testenv.StartDurableRedis(t)
	c := redis.NewClient(&redis.Options{Addr: p.Addr})
	defer c.Close()
	if err := c.Do(context.Background(), "ACL", "SETUSER", "nopublish", "on", ">secret", "~*", "&*", "+@all", "-publish").Err(); err != nil {
		t.Fatal(err)
	}
	code, v := verdicts(t, "redis://nopublish:secret@"+p.Addr)
	if f := v[promiseExclusion]; f.Verdict != fails || !strings.Contains(f.Why, "PUBLISH") || !strings.Contains(f.Fix, "+PUBLISH") {
		t.Errorf("a user without PUBLISH: exclusion %+v", f)
	}
	if code != exitFail {
		t.Errorf("exit %d, want 1", code)
	}
}

// doctor passes (exit 0: every promise holds, some on a condition it
// names) on every configuration make test runs.
func TestDoctorMakeTestConfigurations(t *testing.T) {
	sentinels, master := testenv.SentinelAddrs(t)
	for name, u := range map[string]string{
		"redis":     "redis://" + testenv.RedisAddrs(t, 1)[0],
		"sentinel":  "redis-sentinel://" + strings.Join(sentinels, ",") + "?master_name=" + master + "&replicas=1",
		"cluster":   "redis-cluster://" + strings.Join(testenv.RedisClusterAddrs(t), ","),
		"redlock":   "redlock://" + strings.Join(testenv.RedisAddrs(t, 3)[:3], ","),
		"etcd":      "etcd://" + strings.Join(testenv.EtcdAddrs(t), ","),
		"zk":        "zk://" + strings.Join(testenv.ZooKeeperAddrs(t), ",") + "/oncectl-test",
		"postgres":  testenv.PostgresURL(t),
		"mysql":     testenv.MySQLURL(t),
		"pgbouncer": withQuery(withQuery(testenv.PgBouncerURL(t), "notify", "false"), "default_query_exec_mode", "exec"),
	} {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := oncectl(t, "", "--store", u, "doctor")
			if code != exitOK {
				t.Errorf("exit %d\n%s%s", code, out, errOut)
			}
		})
	}
}

// ZooKeeper: make test's three-member ensemble, one leader, holds; one of
// its members alone tolerates no failure.
func TestDoctorZooKeeper(t *testing.T) {
	addrs := testenv.ZooKeeperAddrs(t)
	// A session the servers grant as asked (make test's ensemble keeps
	// sessions within 0.4 and 4 s).
	good := "zk://" + strings.Join(addrs, ",") + "/oncectl-test?session_timeout=2s"
	code, v := verdicts(t, good, "--ttl", "2s")
	_, out, _ := oncectl(t, "", "--store", good, "doctor")
	if strings.Count(out, "leader,")+strings.Count(out, "standalone,") != 1 || strings.Contains(out, "no answer") {
		t.Errorf("doctor does not show one leader among the members:\n%s", out)
	}
	if f := v[promiseExclusion]; (len(addrs) >= 3) != (f.Verdict == holds) {
		t.Errorf("%d members: exclusion %+v", len(addrs), f)
	}
	if code != exitOK {
		t.Errorf("exit %d", code)
	}
	_, v = verdicts(t, "zk://"+addrs[0]+"/oncectl-test?session_timeout=2s")
	if f := v[promiseExclusion]; f.Verdict != holdsIf || !strings.Contains(f.Why, "tolerates no failure") {
		t.Errorf("one member named: exclusion %+v", f)
	}
	// A session asked above the servers' maxSessionTimeout is clamped.
	_, v = verdicts(t, "zk://"+strings.Join(addrs, ",")+"/oncectl-test?session_timeout=60s")
	if f := v[promiseExclusion]; f.Verdict != holdsIf || !strings.Contains(f.Why, "granted a session of") || !strings.Contains(f.Why, "1m0s asked") {
		t.Errorf("a session asked above maxSessionTimeout: exclusion %+v", f)
	}
	// TTLs longer than the session: a paused holder loses its key while
	// its lease runs on.
	_, v = verdicts(t, good, "--ttl", "30s")
	if f := v[promiseExclusion]; f.Verdict != holdsIf || !strings.Contains(f.Why, "30s TTL") {
		t.Errorf("a TTL beyond the session: exclusion %+v", f)
	}
	// One asked below their minSessionTimeout is raised: a dead holder's
	// key stays taken longer.
	_, v = verdicts(t, "zk://"+strings.Join(addrs, ",")+"/oncectl-test?session_timeout=100ms")
	if f := v[promiseDeadFrees]; f.Verdict != holdsIf || !strings.Contains(f.Why, "not the 100ms asked") {
		t.Errorf("a session asked below minSessionTimeout: dead holder %+v", f)
	}
}

// etcd: make test's one-member cluster tolerates no failure.
func TestDoctorEtcd(t *testing.T) {
	code, v := verdicts(t, "etcd://"+strings.Join(testenv.EtcdAddrs(t), ","))
	members := len(testenv.EtcdAddrs(t))
	if f := v[promiseExclusion]; (members < 3) != (f.Verdict == holdsIf && strings.Contains(f.Why, "tolerates no failure")) {
		t.Errorf("%d member(s): exclusion %+v", members, f)
	}
	if f := v[promiseFences]; f.Verdict != holds {
		t.Errorf("fences: %+v", f)
	}
	if code != exitOK {
		t.Errorf("exit %d", code)
	}
}

func withQuery(raw, k, v string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // (pgx reads no '+' as a space)
	return u.String()
}

// Redlock: a two-node deployment is refused (by the driver itself: its
// majority would be every node), and nodes that keep nothing on disk are
// found.
func TestDoctorRedlock(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 3)
	code, _, errOut := oncectl(t, "", "--store", "redlock://"+strings.Join(addrs[:2], ","), "doctor")
	if code != exitUsage || !strings.Contains(errOut, "odd number") {
		t.Errorf("two nodes: exit %d, %s", code, errOut)
	}
	code, v := verdicts(t, "redlock://"+strings.Join(addrs[:3], ","))
	if code != exitOK {
		t.Errorf("three nodes: exit %d", code)
	}
	if f := v[promiseExclusion]; f.Verdict != holdsIf || !strings.Contains(f.Why, "restarts empty") {
		t.Errorf("three nodes without persistence: exclusion %+v", f)
	}
	if f := v[promiseOnce]; f.Verdict != holdsIf {
		t.Errorf("runs once on Redlock: %+v, want holds if (effects keyed on idem.KeyFrom)", f)
	}
}
