package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/storage/redisstore"
)

// redisStore is a redisstore Store (doctor reads its client).
type redisStore interface{ Client() redisstore.Client }

// diagnoseRedis judges one Redis server (or a Sentinel group's primary):
// eviction, persistence, replicas, round trips and the clock.
func diagnoseRedis(ctx context.Context, s redisStore) (*diagnosis, error) {
	c, ok := s.Client().(*redis.Client)
	if !ok {
		return nil, fmt.Errorf("no checks for a %T yet (doctor checks one Redis server or a Sentinel group's primary; a Cluster's nodes are next)", s.Client())
	}
	cfg, err := c.ConfigGet(ctx, "*").Result()
	if err != nil {
		return nil, fmt.Errorf("CONFIG GET (the user needs the right to read the configuration): %w", err)
	}
	info, err := c.Info(ctx, "server", "replication", "persistence").Result()
	if err != nil {
		return nil, err
	}
	rtt, offset, err := redisRoundTrips(ctx, c)
	if err != nil {
		return nil, err
	}
	in := infoFields(info)
	d := &diagnosis{}
	d.fact("version", "%s", in["redis_version"])
	policy, maxmemory := cfg["maxmemory-policy"], cfg["maxmemory"]
	d.fact("maxmemory / policy", "%s / %s", maxmemory, policy)
	d.fact("appendonly / appendfsync / save", "%s / %s / %q", cfg["appendonly"], cfg["appendfsync"], cfg["save"])
	d.fact("role / replicas / min-replicas-to-write", "%s / %s / %s", in["role"], in["connected_slaves"], cfg["min-replicas-to-write"])
	d.fact("round trip p50 / max", "%v / %v", rtt[len(rtt)/2].Round(time.Microsecond), rtt[len(rtt)-1].Round(time.Microsecond))
	d.fact("clock offset (server − this machine)", "%v", offset.Round(time.Millisecond))

	evicts := policy != "noeviction" && maxmemory != "0"
	unbounded := policy != "noeviction" && maxmemory == "0"
	volatile := cfg["appendonly"] != "yes" && strings.TrimSpace(cfg["save"]) == ""
	snapshots := cfg["appendonly"] != "yes" && !volatile
	replicas, _ := strconv.Atoi(in["connected_slaves"])
	unacked := replicas > 0 && cfg["min-replicas-to-write"] == "0"
	const evictFix = "CONFIG SET maxmemory-policy noeviction (and give maxmemory room for oncekit's keys): a full server then refuses writes instead"
	evict := when(evicts, fails, fmt.Sprintf("maxmemory-policy %s evicts keys when the server is full: a held lock key or a record in flight can go, and a second holder take it", policy), evictFix)
	persistFix := "appendonly yes with appendfsync everysec (a second of writes at risk) or always"
	failover := when(unacked, holdsIf, fmt.Sprintf("no failover to one of its %d replicas: they acknowledge nothing (min-replicas-to-write 0), so a promoted replica may lack the last grants", replicas),
		"redisstore.WithReplicas(n, timeout) on every Store (each grant waits for n replicas), or min-replicas-to-write")

	d.judge(promiseExclusion, "one server, every grant a script on it", evict,
		when(volatile, holdsIf, "the server is not restarted: it keeps nothing on disk, and an empty restart frees every key at once", persistFix),
		failover,
		when(unbounded, holdsIf, fmt.Sprintf("the server never fills up: maxmemory-policy %s with no maxmemory evicts nothing until it does", policy), evictFix))
	d.judge(promiseFences, "each fence is at least the server's clock in µs, also after an empty restart",
		when(offset.Abs() > time.Minute, holdsIf, fmt.Sprintf("the server's clock does not step back: it is %v from this machine's", offset.Round(time.Second)), "run NTP on the server"))
	onceFix := persistFix
	d.judge(promiseOnce, "a run's record and its effect commit in one script", evict,
		when(volatile, holdsIf, "the server is not restarted: records live only in memory, and a retry after a restart runs again", onceFix),
		when(snapshots, holdsIf, "the server does not crash between snapshots: records since the last one are lost, and their retries run again", onceFix),
		when(cfg["appendonly"] == "yes" && cfg["appendfsync"] != "always", holdsIf,
			fmt.Sprintf("the machine does not crash: appendfsync %s loses up to a second of completions", cfg["appendfsync"]), "appendfsync always"),
		failover)
	d.judge(promiseDeadFrees, "every key oncekit writes expires by the server's clock",
		when(rtt[len(rtt)-1] > time.Second, holdsIf, fmt.Sprintf("TTLs are well above the round trip: one took %v", rtt[len(rtt)-1].Round(time.Millisecond)), "keep TTLs at least ten round trips long"))
	d.judge(promiseRetry, "attempts are counted beside the record", evict,
		when(volatile || snapshots, holdsIf, "the server keeps its memory: a restart forgets the attempts of claims that died", persistFix))
	return d, nil
}

// redisRoundTrips measures ten round trips (sorted) and the server's clock
// against this machine's, read halfway through the fastest one.
func redisRoundTrips(ctx context.Context, c *redis.Client) ([]time.Duration, time.Duration, error) {
	var rtt []time.Duration
	var offset time.Duration
	best := time.Duration(1<<63 - 1)
	for range 10 {
		start := time.Now()
		t, err := c.Time(ctx).Result()
		d := time.Since(start)
		if err != nil {
			return nil, 0, err
		}
		rtt = append(rtt, d)
		if d < best {
			best, offset = d, t.Sub(start.Add(d/2))
		}
	}
	slices.Sort(rtt)
	if len(rtt) == 0 {
		return nil, 0, errors.New("no round trip")
	}
	return rtt, offset, nil
}

// infoFields parses INFO's "name:value" lines.
func infoFields(info string) map[string]string {
	m := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}
