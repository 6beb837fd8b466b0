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
	"github.com/oncekit/oncekit/storage/redlockstore"
)

// redisStore is a redisstore Store (doctor reads its client).
type redisStore interface{ Client() redisstore.Client }

// redlockStore is a redlockstore Store (doctor reads its nodes' clients).
type redlockStore interface{ Clients() []redlockstore.Client }

// redisNode is what doctor reads of one Redis server.
type redisNode struct {
	cfg    map[string]string
	info   map[string]string
	rtt    []time.Duration // sorted
	offset time.Duration   // the server's clock − this machine's
}

// readRedis reads a server's configuration, INFO and round trips.
func readRedis(ctx context.Context, c *redis.Client) (*redisNode, error) {
	cfg, err := c.ConfigGet(ctx, "*").Result()
	if err != nil {
		return nil, fmt.Errorf("%s: CONFIG GET (the user needs the right to read the configuration): %w", c.Options().Addr, err)
	}
	info, err := c.Info(ctx, "server", "replication", "persistence").Result()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Options().Addr, err)
	}
	rtt, offset, err := redisRoundTrips(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Options().Addr, err)
	}
	return &redisNode{cfg: cfg, info: infoFields(info), rtt: rtt, offset: offset}, nil
}

func (n *redisNode) facts(d *diagnosis, prefix string) {
	d.fact(prefix+"version", "%s", n.info["redis_version"])
	d.fact(prefix+"maxmemory / policy", "%s / %s", n.cfg["maxmemory"], n.cfg["maxmemory-policy"])
	d.fact(prefix+"appendonly / appendfsync / save", "%s / %s / %q", n.cfg["appendonly"], n.cfg["appendfsync"], n.cfg["save"])
	d.fact(prefix+"role / replicas / min-replicas-to-write", "%s / %s / %s", n.info["role"], n.info["connected_slaves"], n.cfg["min-replicas-to-write"])
	d.fact(prefix+"round trip p50 / max", "%v / %v", n.rtt[len(n.rtt)/2].Round(time.Microsecond), n.rtt[len(n.rtt)-1].Round(time.Microsecond))
	d.fact(prefix+"clock offset (server − this machine)", "%v", n.offset.Round(time.Millisecond))
}

// The hazards one Redis server can have.
func (n *redisNode) evicts() bool {
	return n.cfg["maxmemory-policy"] != "noeviction" && n.cfg["maxmemory"] != "0"
}
func (n *redisNode) unbounded() bool {
	return n.cfg["maxmemory-policy"] != "noeviction" && n.cfg["maxmemory"] == "0"
}
func (n *redisNode) volatile() bool {
	return n.cfg["appendonly"] != "yes" && strings.TrimSpace(n.cfg["save"]) == ""
}
func (n *redisNode) snapshots() bool { return n.cfg["appendonly"] != "yes" && !n.volatile() }
func (n *redisNode) replicas() int   { r, _ := strconv.Atoi(n.info["connected_slaves"]); return r }

const (
	evictFix   = "CONFIG SET maxmemory-policy noeviction (and give maxmemory room for oncekit's keys): a full server then refuses writes instead"
	persistFix = "appendonly yes with appendfsync everysec (a second of writes at risk) or always"
)

func (n *redisNode) eviction() finding {
	return when(n.evicts(), fails, fmt.Sprintf("maxmemory-policy %s evicts keys when the server is full: a held lock key or a record in flight can go, and a second holder take it", n.cfg["maxmemory-policy"]), evictFix)
}

// diagnoseRedis judges one Redis server (or a Sentinel group's primary):
// eviction, persistence, replicas, round trips and the clock.
func diagnoseRedis(ctx context.Context, s redisStore) (*diagnosis, error) {
	c, ok := s.Client().(*redis.Client)
	if !ok {
		return nil, fmt.Errorf("no checks for a %T yet (doctor checks one Redis server or a Sentinel group's primary; a Cluster's nodes are next)", s.Client())
	}
	n, err := readRedis(ctx, c)
	if err != nil {
		return nil, err
	}
	d := &diagnosis{}
	n.facts(d, "")
	evict := n.eviction()
	replicas := n.replicas()
	failover := when(replicas > 0 && n.cfg["min-replicas-to-write"] == "0", holdsIf,
		fmt.Sprintf("no failover to one of its %d replicas: they acknowledge nothing (min-replicas-to-write 0), so a promoted replica may lack the last grants", replicas),
		"redisstore.WithReplicas(n, timeout) on every Store (each grant waits for n replicas), or min-replicas-to-write")
	d.judge(promiseExclusion, "one server, every grant a script on it", evict,
		when(n.volatile(), holdsIf, "the server is not restarted: it keeps nothing on disk, and an empty restart frees every key at once", persistFix),
		failover,
		when(n.unbounded(), holdsIf, fmt.Sprintf("the server never fills up: maxmemory-policy %s with no maxmemory evicts nothing until it does", n.cfg["maxmemory-policy"]), evictFix))
	d.judge(promiseFences, "each fence is at least the server's clock in µs, also after an empty restart",
		when(n.offset.Abs() > time.Minute, holdsIf, fmt.Sprintf("the server's clock does not step back: it is %v from this machine's", n.offset.Round(time.Second)), "run NTP on the server"))
	d.judge(promiseOnce, "a run's record and its effect commit in one script", evict,
		when(n.volatile(), holdsIf, "the server is not restarted: records live only in memory, and a retry after a restart runs again", persistFix),
		when(n.snapshots(), holdsIf, "the server does not crash between snapshots: records since the last one are lost, and their retries run again", persistFix),
		when(n.cfg["appendonly"] == "yes" && n.cfg["appendfsync"] != "always", holdsIf,
			fmt.Sprintf("the machine does not crash: appendfsync %s loses up to a second of completions", n.cfg["appendfsync"]), "appendfsync always"),
		failover)
	d.judge(promiseDeadFrees, "every key oncekit writes expires by the server's clock",
		when(n.rtt[len(n.rtt)-1] > time.Second, holdsIf, fmt.Sprintf("TTLs are well above the round trip: one took %v", n.rtt[len(n.rtt)-1].Round(time.Millisecond)), "keep TTLs at least ten round trips long"))
	d.judge(promiseRetry, "attempts are counted beside the record", evict,
		when(n.volatile() || n.snapshots(), holdsIf, "the server keeps its memory: a restart forgets the attempts of claims that died", persistFix))
	return d, nil
}

// diagnoseRedlock judges a Redlock deployment: each node as one server,
// and their clocks.
func diagnoseRedlock(ctx context.Context, s redlockStore) (*diagnosis, error) {
	d := &diagnosis{}
	clients := s.Clients()
	var nodes []*redisNode
	for i, cl := range clients {
		c, ok := cl.(*redis.Client)
		if !ok {
			return nil, fmt.Errorf("node %d: no checks for a %T", i+1, cl)
		}
		n, err := readRedis(ctx, c)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
		n.facts(d, fmt.Sprintf("node %d (%s): ", i+1, c.Options().Addr))
	}
	var evict, volatile, spread finding
	var lo, hi time.Duration
	for i, n := range nodes {
		if f := n.eviction(); f.Verdict != "" && evict.Verdict == "" {
			f.Why = fmt.Sprintf("node %d: %s", i+1, f.Why)
			evict = f
		}
		if n.volatile() && volatile.Verdict == "" {
			volatile = when(true, holdsIf, fmt.Sprintf("no node restarts empty within a TTL (node %d keeps nothing on disk): a majority that restarts empty frees a held key", i+1),
				"delay each node's restart by the longest TTL, or appendonly yes with appendfsync always")
		}
		if i == 0 || n.offset < lo {
			lo = n.offset
		}
		if i == 0 || n.offset > hi {
			hi = n.offset
		}
	}
	d.fact("nodes / majority", "%d / %d", len(nodes), len(nodes)/2+1)
	d.fact("clock spread between nodes", "%v", (hi - lo).Round(time.Millisecond))
	// (An even count, or fewer than three nodes, redlockstore refuses
	// itself: doctor never gets here with one.)
	spread = when(hi-lo > time.Minute, holdsIf, fmt.Sprintf("the nodes' clocks do not step back: they are %v apart", (hi-lo).Round(time.Second)), "run NTP on every node")
	d.judge(promiseExclusion, "a majority of independent nodes, each grant a script on each (clock rates within 1 %)", evict, volatile)
	d.judge(promiseFences, "the fence is written back on a majority; each node's is at least its clock", spread)
	d.judge(promiseOnce, "for effects keyed on idem.KeyFrom: records live on a majority", evict, volatile,
		when(true, holdsIf, "the effect is keyed on idem.KeyFrom: Redlock's records cannot commit with an effect", "key the effect's write on idem.KeyFrom (a unique column, a conditional write)"))
	d.judge(promiseDeadFrees, "every key expires by its node's clock")
	d.judge(promiseRetry, "attempts are counted on a majority", evict, volatile)
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
