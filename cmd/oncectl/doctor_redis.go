package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	denied []string        // commands the driver needs that the user may not run
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
	return &redisNode{cfg: cfg, info: infoFields(info), rtt: rtt, offset: offset, denied: redisDenied(ctx, c)}, nil
}

// redisDenied tries, harmlessly, each command the driver needs and
// returns those the server refuses for lack of rights (NOPERM): EVALSHA
// of a script it does not have, PUBLISH to a channel of doctor's own, a
// SUBSCRIBE and WAIT for no replica.
func redisDenied(ctx context.Context, c *redis.Client) []string {
	noperm := func(err error) bool { return err != nil && strings.Contains(err.Error(), "NOPERM") }
	var denied []string
	if noperm(c.EvalSha(ctx, "0000000000000000000000000000000000000000", nil).Err()) {
		denied = append(denied, "EVALSHA")
	}
	if noperm(c.ScriptExists(ctx, "0000000000000000000000000000000000000000").Err()) {
		denied = append(denied, "SCRIPT")
	}
	if noperm(c.Publish(ctx, "oncectl-doctor", "").Err()) {
		denied = append(denied, "PUBLISH")
	}
	sub := c.Subscribe(ctx)
	if noperm(sub.Subscribe(ctx, "oncectl-doctor")) {
		denied = append(denied, "SUBSCRIBE")
	} else if _, err := sub.ReceiveTimeout(ctx, 2*time.Second); noperm(err) {
		denied = append(denied, "SUBSCRIBE")
	}
	sub.Close()
	if noperm(c.Wait(ctx, 0, 1).Err()) {
		denied = append(denied, "WAIT")
	}
	return denied
}

func (n *redisNode) facts(d *diagnosis, prefix string) {
	d.fact(prefix+"version", "%s", n.info["redis_version"])
	d.fact(prefix+"maxmemory / policy", "%s / %s", n.cfg["maxmemory"], n.cfg["maxmemory-policy"])
	d.fact(prefix+"appendonly / appendfsync / save", "%s / %s / %q", n.cfg["appendonly"], n.cfg["appendfsync"], n.cfg["save"])
	d.fact(prefix+"role / replicas / min-replicas-to-write", "%s / %s / %s", n.info["role"], n.info["connected_slaves"], n.cfg["min-replicas-to-write"])
	d.fact(prefix+"round trip p50 / max", "%v / %v", n.rtt[len(n.rtt)/2].Round(time.Microsecond), n.rtt[len(n.rtt)-1].Round(time.Microsecond))
	d.fact(prefix+"clock offset (server − this machine)", "%v", n.offset.Round(time.Millisecond))
}

// rights is a finding when the user lacks a command the driver needs.
func (n *redisNode) rights() finding {
	if len(n.denied) == 0 {
		return finding{}
	}
	return finding{Verdict: fails, Why: "the user may not run " + strings.Join(n.denied, ", ") + ": the driver's requests fail",
		Fix: "ACL SETUSER <user> +" + strings.Join(n.denied, " +") + " (with +@scripting, +@pubsub)"}
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

// diagnoseRedis judges one Redis server (or a Sentinel group's primary,
// and its Sentinels), or each primary of a Cluster: eviction,
// persistence, replicas, round trips, the clock, the rights the driver
// needs.
func diagnoseRedis(ctx context.Context, s redisStore, rawURL string, ttl time.Duration) (*diagnosis, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	withReplicas := u.Query().Get("replicas") != ""
	switch c := s.Client().(type) {
	case *redis.Client:
		n, err := readRedis(ctx, c)
		if err != nil {
			return nil, err
		}
		d := &diagnosis{}
		n.facts(d, "")
		var sentinel finding
		if u.Scheme == "redis-sentinel" || u.Scheme == "rediss-sentinel" {
			if sentinel, err = diagnoseSentinel(ctx, d, u, n, withReplicas, ttl); err != nil {
				return nil, err
			}
		}
		// With Sentinels, their finding speaks of failover (with how
		// soon one comes).
		d.Findings = judgeRedisNode(n, withReplicas || sentinel.Verdict != "", ttl)
		if sentinel.Verdict != "" {
			d.Findings = append(d.Findings, withPromise(sentinel, promiseExclusion), withPromise(sentinel, promiseOnce))
		}
		return d, nil
	case *redis.ClusterClient:
		return diagnoseCluster(ctx, c, withReplicas, ttl)
	}
	return nil, fmt.Errorf("no checks for a %T", s.Client())
}

// judgeRedisNode is each promise's verdict on one server.
func judgeRedisNode(n *redisNode, withReplicas bool, ttl time.Duration) []finding {
	d := &diagnosis{}
	evict := n.eviction()
	acl := n.rights()
	replicas := n.replicas()
	failover := when(replicas > 0 && n.cfg["min-replicas-to-write"] == "0" && !withReplicas, holdsIf,
		fmt.Sprintf("no failover to one of its %d replicas: they acknowledge nothing (min-replicas-to-write 0, no replicas= in the URL), so a promoted replica may lack the last grants", replicas),
		"redisstore.WithReplicas(n, timeout) on every Store (replicas=N in the URL: each grant waits for n replicas), or min-replicas-to-write")
	d.judge(promiseExclusion, "one server, every grant a script on it", evict, acl,
		when(n.volatile(), holdsIf, "the server is not restarted: it keeps nothing on disk, and an empty restart frees every key at once", persistFix),
		failover,
		when(n.unbounded(), holdsIf, fmt.Sprintf("the server never fills up: maxmemory-policy %s with no maxmemory evicts nothing until it does", n.cfg["maxmemory-policy"]), evictFix))
	d.judge(promiseFences, "each fence is at least the server's clock in µs, also after an empty restart",
		when(n.offset.Abs() > time.Minute, holdsIf, fmt.Sprintf("the server's clock does not step back: it is %v from this machine's", n.offset.Round(time.Second)), "run NTP on the server"))
	d.judge(promiseOnce, "a run's record and its effect commit in one script", evict, acl,
		when(n.volatile(), holdsIf, "the server is not restarted: records live only in memory, and a retry after a restart runs again", persistFix),
		when(n.snapshots(), holdsIf, "the server does not crash between snapshots: records since the last one are lost, and their retries run again", persistFix),
		when(n.cfg["appendonly"] == "yes" && n.cfg["appendfsync"] != "always", holdsIf,
			fmt.Sprintf("the machine does not crash: appendfsync %s loses up to a second of completions", n.cfg["appendfsync"]), "appendfsync always"),
		failover)
	d.judge(promiseDeadFrees, "every key oncekit writes expires by the server's clock", acl,
		when(n.rtt[len(n.rtt)-1] > ttl/10, holdsIf, fmt.Sprintf("TTLs are well above the round trip: one took %v, more than a tenth of the %v TTL (--ttl)", n.rtt[len(n.rtt)-1].Round(time.Millisecond), ttl), "keep TTLs at least ten round trips long"))
	d.judge(promiseRetry, "attempts are counted beside the record", evict, acl,
		when(n.volatile() || n.snapshots(), holdsIf, "the server keeps its memory: a restart forgets the attempts of claims that died", persistFix))
	return d.Findings
}

func withPromise(f finding, p string) finding { f.Promise = p; return f }

// diagnoseCluster judges a Redis Cluster: slot coverage, replicas per
// shard, and each primary as one server.
func diagnoseCluster(ctx context.Context, c *redis.ClusterClient, withReplicas bool, ttl time.Duration) (*diagnosis, error) {
	d := &diagnosis{}
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return nil, err
	}
	ci := infoFields(info)
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	d.fact("cluster state / slots assigned / ok", "%s / %s / %s", ci["cluster_state"], ci["cluster_slots_assigned"], ci["cluster_slots_ok"])
	bare := 0
	for _, sh := range shards {
		if !slices.ContainsFunc(sh.Nodes, func(n redis.Node) bool { return n.Role == "replica" && n.Health == "online" }) {
			bare++
		}
	}
	d.fact("shards / without a replica online", "%d / %d", len(shards), bare)
	var mu sync.Mutex
	var order []string             // each condition's text, first seen first
	where := map[string][]string{} // the primaries it applies to
	byText := map[string]finding{}
	primaries := 0
	err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := readRedis(ctx, m)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		primaries++
		n.facts(d, m.Options().Addr+": ")
		for _, f := range judgeRedisNode(n, withReplicas, ttl) {
			k := f.Promise + "\x00" + f.Verdict + "\x00" + f.Why
			if _, ok := byText[k]; !ok {
				order = append(order, k)
				byText[k] = f
			}
			where[k] = append(where[k], m.Options().Addr)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, k := range order {
		f := byText[k]
		if f.Verdict != holds {
			on := "on every primary"
			if len(where[k]) < primaries {
				slices.Sort(where[k])
				on = "on " + strings.Join(where[k], ", ")
			}
			f.Why += " (" + on + ")"
		}
		d.Findings = append(d.Findings, f)
	}
	if ci["cluster_state"] != "ok" {
		d.Findings = append(d.Findings, finding{Promise: promiseExclusion, Verdict: holdsIf,
			Why: fmt.Sprintf("the cluster serves every slot: cluster_state is %s, and keys in the slots it does not serve can be neither taken nor claimed", ci["cluster_state"]),
			Fix: "redis-cli --cluster check, then fix the slots"})
	}
	if bare > 0 {
		f := finding{Verdict: holdsIf, Why: fmt.Sprintf("no primary of the %d shard(s) without a replica fails: its keys and records go with it", bare), Fix: "give every shard a replica (and replicas=N in the URL)"}
		d.Findings = append(d.Findings, withPromise(f, promiseOnce), withPromise(f, promiseRetry))
	}
	return d, nil
}

// diagnoseSentinel reads the Sentinels the URL names about the primary:
// their quorum, how long a primary may be silent before a failover, and
// whether a failover keeps the last grants.
func diagnoseSentinel(ctx context.Context, d *diagnosis, u *url.URL, primary *redisNode, withReplicas bool, ttl time.Duration) (finding, error) {
	hosts := strings.Split(u.Host, ",")
	name := u.Query().Get("master_name")
	var m map[string]string
	reachable := 0
	for _, h := range hosts {
		sc := redis.NewSentinelClient(&redis.Options{Addr: h, Username: u.User.Username(), Password: sentinelPassword(u), DialTimeout: 2 * time.Second})
		got, err := sc.Master(ctx, name).Result()
		sc.Close()
		if err != nil {
			d.fact("sentinel "+h, "no answer: %v", err)
			continue
		}
		reachable++
		m = got
	}
	if m == nil {
		return finding{}, fmt.Errorf("no Sentinel the URL names answers about %q", name)
	}
	down, _ := strconv.Atoi(m["down-after-milliseconds"])
	others, _ := strconv.Atoi(m["num-other-sentinels"])
	d.fact("sentinels (URL / answering / known)", "%d / %d / %d", len(hosts), reachable, others+1)
	d.fact("quorum / down-after-milliseconds / replicas", "%s / %s / %s", m["quorum"], m["down-after-milliseconds"], m["num-slaves"])
	if primary.cfg["min-replicas-to-write"] == "0" && !withReplicas {
		return finding{Verdict: holdsIf,
			Why: fmt.Sprintf("no failover happens while a lease is held: a primary silent for %v is replaced (%s the %v TTL, --ttl), and a replica acknowledges nothing (no replicas= in the URL, min-replicas-to-write 0), so the new primary may lack the last grants and records",
				time.Duration(down)*time.Millisecond, map[bool]string{true: "sooner than", false: "no sooner than"}[time.Duration(down)*time.Millisecond < ttl], ttl),
			Fix: "replicas=N in the URL (redisstore.WithReplicas), and down-after-milliseconds well above your longest TTL"}, nil
	}
	return finding{}, nil
}

// sentinelPassword is the Sentinels' password: sentinel_password= in the
// URL, else the primary's.
func sentinelPassword(u *url.URL) string {
	if p := u.Query().Get("sentinel_password"); p != "" {
		return p
	}
	p, _ := u.User.Password()
	return p
}

// diagnoseRedlock judges a Redlock deployment: each node as one server,
// and their clocks.
func diagnoseRedlock(ctx context.Context, s redlockStore, ttl time.Duration) (*diagnosis, error) {
	d := &diagnosis{}
	clients := s.Clients()
	var nodes []*redisNode
	var evict finding // the first node's that evicts, or lacks a right
	for i, cl := range clients {
		c, ok := cl.(*redis.Client)
		if !ok {
			return nil, fmt.Errorf("node %d: no checks for a %T", i+1, cl)
		}
		n, err := readRedis(ctx, c)
		if err != nil {
			return nil, err
		}
		if f := n.rights(); f.Verdict != "" && evict.Verdict == "" {
			f.Why = fmt.Sprintf("node %d: %s", i+1, f.Why)
			evict = f
		}
		nodes = append(nodes, n)
		n.facts(d, fmt.Sprintf("node %d (%s): ", i+1, c.Options().Addr))
	}
	var volatile, spread finding
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
	spread = when(hi-lo > ttl/2, holdsIf, fmt.Sprintf("the nodes' clocks come within half the %v TTL (--ttl) of each other: they are %v apart, and an acquisition whose fence runs more than half its TTL ahead of a node's clock is refused (redlockstore.ErrClockSkew)", ttl, (hi-lo).Round(time.Millisecond)), "run NTP on every node")
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

// quietRedisLog silences go-redis's logger.
func quietRedisLog() { redis.SetLogger(quietLogger{}) }

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
