package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelAddrs returns the sentinels of the test Sentinel deployment from
// REDIS_SENTINEL_ADDRS and its master name from REDIS_SENTINEL_MASTER, or
// skips (fails under ONCEKIT_REQUIRE_SERVERS=1).
func SentinelAddrs(tb testing.TB) (sentinels []string, master string) {
	tb.Helper()
	sentinels = addrs(tb, "REDIS_SENTINEL_ADDRS", 1)
	master = os.Getenv("REDIS_SENTINEL_MASTER")
	if master == "" {
		master = "oncekit"
	}
	return sentinels, master
}

// SentinelGroup is a replicated Redis of a test's own: a primary, its
// replicas, and three sentinels that fail it over 500 ms after it stops
// answering (failover timeout 2 s).
type SentinelGroup struct {
	tb        testing.TB
	Master    string // the name the sentinels monitor it by
	Servers   []*RedisProcess
	Sentinels []*RedisProcess
	// links are the replicas' connections to the first primary, each
	// through a proxy of its own (HoldReplication).
	links []*Proxy
}

// StartSentinelGroup starts a primary with n replicas and three sentinels
// on free 127.0.0.1 ports (no persistence) and stops them at cleanup. It
// waits until the replicas are in sync and every sentinel sees them.
func StartSentinelGroup(tb testing.TB, replicas int) *SentinelGroup {
	tb.Helper()
	skipShort(tb)
	NeedCommand(tb, "redis-server")
	g := &SentinelGroup{tb: tb, Master: "oncekit-test"}
	var primary string
	for i := range 1 + replicas {
		p := &RedisProcess{tb: tb, port: freePort(tb), dir: tb.TempDir()}
		p.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
		p.args = []string{"--port", strconv.Itoa(p.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", p.dir, "--logfile", filepath.Join(p.dir, "redis.log")}
		if i == 0 {
			primary = strconv.Itoa(p.port)
		} else {
			// Through a proxy, so that a test can hold its stream back.
			// (The sentinels would point a replica whose primary they do
			// not know back at the real one, but only after the failover
			// timeout, one minute here.)
			link := StartProxy(tb, net.JoinHostPort("127.0.0.1", primary))
			g.links = append(g.links, link)
			host, port, _ := net.SplitHostPort(link.Addr)
			p.args = append(p.args, "--replicaof", host, port)
		}
		p.Start()
		tb.Cleanup(p.Kill)
		g.Servers = append(g.Servers, p)
	}
	for range 3 {
		p := &RedisProcess{tb: tb, port: freePort(tb), dir: tb.TempDir()}
		p.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
		conf := filepath.Join(p.dir, "sentinel.conf")
		cfg := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\nsentinel monitor %s 127.0.0.1 %s 2\n"+
			"sentinel down-after-milliseconds %s 500\nsentinel failover-timeout %s 60000\nsentinel parallel-syncs %s 2\n",
			p.port, p.dir, filepath.Join(p.dir, "redis.log"), g.Master, primary, g.Master, g.Master, g.Master)
		if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
			tb.Fatal(err)
		}
		p.args = []string{conf, "--sentinel"}
		p.Start()
		tb.Cleanup(p.Kill)
		g.Sentinels = append(g.Sentinels, p)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, r := range g.Servers[1:] {
		for !strings.Contains(g.info(r.Addr, "replication"), "master_link_status:up") {
			if time.Now().After(deadline) {
				tb.Fatalf("replica %s not in sync", r.Addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, s := range g.Sentinels {
		for g.seenReplicas(s.Addr) < replicas {
			if time.Now().After(deadline) {
				tb.Fatalf("sentinel %s does not see the replicas", s.Addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return g
}

// HoldReplication holds back what the first primary sends its replicas:
// writes reach the primary, and the replicas do not get them.
func (g *SentinelGroup) HoldReplication() {
	for _, l := range g.links {
		l.Stall()
	}
}

// ResumeReplication forwards the held stream and what comes next.
func (g *SentinelGroup) ResumeReplication() {
	for _, l := range g.links {
		l.Resume()
	}
}

// DropReplication closes the replicas' links to the first primary,
// dropping what they held: a primary that dies takes those writes with it.
func (g *SentinelGroup) DropReplication() {
	for _, l := range g.links {
		l.Cut()
	}
}

// SentinelAddrs are the sentinels' addresses.
func (g *SentinelGroup) SentinelAddrs() []string {
	var a []string
	for _, s := range g.Sentinels {
		a = append(a, s.Addr)
	}
	return a
}

func (g *SentinelGroup) info(addr, section string) string {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer c.Close()
	s, _ := c.Info(context.Background(), section).Result()
	return s
}

func (g *SentinelGroup) seenReplicas(addr string) int {
	c := redis.NewSentinelClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer c.Close()
	r, err := c.Replicas(context.Background(), g.Master).Result()
	if err != nil {
		return 0
	}
	return len(r)
}

// Primary is the server the sentinels name as the primary now.
func (g *SentinelGroup) Primary() *RedisProcess {
	g.tb.Helper()
	for _, s := range g.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, DialTimeout: time.Second, ReadTimeout: time.Second})
		a, err := c.GetMasterAddrByName(context.Background(), g.Master).Result()
		c.Close()
		if err != nil || len(a) != 2 {
			continue
		}
		for _, p := range g.Servers {
			if p.Addr == net.JoinHostPort(a[0], a[1]) {
				return p
			}
		}
	}
	g.tb.Fatal("no sentinel names a primary")
	return nil
}

// WaitFailover waits until the sentinels name another primary than old,
// and it answers as a primary.
func (g *SentinelGroup) WaitFailover(old *RedisProcess, timeout time.Duration) *RedisProcess {
	g.tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if p := g.Primary(); p != old && strings.Contains(g.info(p.Addr, "replication"), "role:master") {
			return p
		}
		if time.Now().After(deadline) {
			g.tb.Fatalf("no failover from %s within %s", old.Addr, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
