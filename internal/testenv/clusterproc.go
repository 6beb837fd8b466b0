package testenv

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a Redis Cluster of a test's own: primaries, each with
// its replicas, that fail a primary over to a replica 1 s after it stops
// answering (cluster-node-timeout).
type RedisCluster struct {
	tb    testing.TB
	Nodes []*RedisProcess
}

// StartRedisCluster starts a cluster of primaries × (1 + replicas) nodes
// on free 127.0.0.1 ports (no persistence), waits until every slot is
// served, and stops it at cleanup. It skips (fails under
// ONCEKIT_REQUIRE_SERVERS=1) when redis-server is not installed.
func StartRedisCluster(tb testing.TB, primaries, replicas int) *RedisCluster {
	tb.Helper()
	skipShort(tb)
	NeedCommand(tb, "redis-server")
	rc := &RedisCluster{tb: tb}
	var addrs []string
	for range primaries * (1 + replicas) {
		p := &RedisProcess{tb: tb, port: freePort(tb), dir: tb.TempDir()}
		p.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
		// The cluster bus gets a free port of its own: the default, the
		// port + 10000, may be any other socket's ephemeral port.
		p.args = []string{"--port", strconv.Itoa(p.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", p.dir, "--logfile", filepath.Join(p.dir, "redis.log"),
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(p.dir, "nodes.conf"),
			"--cluster-port", strconv.Itoa(freePort(tb)), "--cluster-node-timeout", "1000"}
		p.Start()
		tb.Cleanup(p.Kill)
		rc.Nodes = append(rc.Nodes, p)
		addrs = append(addrs, p.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	rc.WaitOK(30 * time.Second)
	// And every replica in sync with its primary.
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range rc.Nodes {
		for {
			c := redis.NewClient(&redis.Options{Addr: n.Addr, DialTimeout: time.Second, ReadTimeout: time.Second})
			info, _ := c.Info(context.Background(), "replication").Result()
			c.Close()
			if strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up") {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("replica %s not in sync: %s", n.Addr, info)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return rc
}

// Addrs are the nodes' addresses, to seed a client.
func (rc *RedisCluster) Addrs() []string {
	var a []string
	for _, n := range rc.Nodes {
		a = append(a, n.Addr)
	}
	return a
}

// WaitOK waits until every live node reports the cluster ok, with one
// primary per slot range.
func (rc *RedisCluster) WaitOK(timeout time.Duration) {
	rc.tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		for _, n := range rc.Nodes {
			if n.cmd == nil {
				continue
			}
			c := redis.NewClient(&redis.Options{Addr: n.Addr, DialTimeout: time.Second, ReadTimeout: time.Second})
			info, err := c.ClusterInfo(context.Background()).Result()
			c.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			rc.tb.Fatalf("Redis Cluster not ok after %s", timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// PrimaryOf is the node that serves key as a primary now.
func (rc *RedisCluster) PrimaryOf(key string) *RedisProcess {
	rc.tb.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.live()})
	defer c.Close()
	node, err := c.MasterForKey(context.Background(), key)
	if err != nil {
		rc.tb.Fatal(err)
	}
	addr := node.Options().Addr
	for _, n := range rc.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	rc.tb.Fatalf("no node at %s", addr)
	return nil
}

func (rc *RedisCluster) live() []string {
	var a []string
	for _, n := range rc.Nodes {
		if n.cmd != nil {
			a = append(a, n.Addr)
		}
	}
	return a
}

// WaitFailover waits until another node than old serves key as a primary.
func (rc *RedisCluster) WaitFailover(key string, old *RedisProcess, timeout time.Duration) *RedisProcess {
	rc.tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, n := range rc.Nodes {
			if n == old || n.cmd == nil {
				continue
			}
			c := redis.NewClient(&redis.Options{Addr: n.Addr, DialTimeout: time.Second, ReadTimeout: time.Second})
			slot, _ := c.ClusterKeySlot(context.Background(), key).Result()
			nodes, _ := c.ClusterShards(context.Background()).Result()
			c.Close()
			for _, sh := range nodes {
				served := false
				for _, r := range sh.Slots {
					if slot >= r.Start && slot <= r.End {
						served = true
					}
				}
				if !served {
					continue
				}
				for _, nd := range sh.Nodes {
					if nd.Role == "master" && nd.Health == "online" && fmt.Sprintf("%s:%d", nd.IP, nd.Port) != old.Addr {
						for _, p := range rc.Nodes {
							if p.Addr == fmt.Sprintf("%s:%d", nd.IP, nd.Port) {
								return p
							}
						}
					}
				}
			}
		}
		if time.Now().After(deadline) {
			rc.tb.Fatalf("no failover of %s within %s", old.Addr, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// replicasOf are the live nodes replicating from primary.
func (rc *RedisCluster) replicasOf(primary *RedisProcess) []*RedisProcess {
	var out []*RedisProcess
	for _, n := range rc.Nodes {
		if n == primary || n.cmd == nil {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: n.Addr, DialTimeout: time.Second, ReadTimeout: time.Second})
		info, _ := c.Info(context.Background(), "replication").Result()
		c.Close()
		if strings.Contains(info, "master_port:"+strconv.Itoa(primary.port)+"\r\n") {
			out = append(out, n)
		}
	}
	return out
}

// HoldReplication cuts primary's replicas off it, as a slow link would:
// they log in to it as a user it does not have (masteruser), and their
// links are closed, so nothing it is written from now on reaches them
// (they keep trying). It returns once every replica's link is down.
func (rc *RedisCluster) HoldReplication(primary *RedisProcess) {
	rc.tb.Helper()
	reps := rc.replicasOf(primary)
	if len(reps) == 0 {
		rc.tb.Fatalf("%s has no replicas", primary.Addr)
	}
	for _, n := range reps {
		rc.do(n, "CONFIG", "SET", "masteruser", "oncekit-held", "masterauth", "held")
	}
	rc.do(primary, "CLIENT", "KILL", "TYPE", "replica")
	rc.waitLinks(reps, "down")
}

// ResumeReplication lets primary's replicas back in (HoldReplication) and
// returns once they are in sync.
func (rc *RedisCluster) ResumeReplication(primary *RedisProcess) {
	rc.tb.Helper()
	var reps []*RedisProcess
	for _, n := range rc.Nodes {
		if n != primary && n.cmd != nil {
			reps = append(reps, n)
		}
	}
	for _, n := range reps {
		rc.do(n, "CONFIG", "SET", "masteruser", "", "masterauth", "")
	}
	rc.waitLinks(rc.replicasOf(primary), "up")
}

func (rc *RedisCluster) do(n *RedisProcess, args ...any) {
	rc.tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: n.Addr, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer c.Close()
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		rc.tb.Fatalf("%s %v: %v", n.Addr, args, err)
	}
}

// waitLinks waits until every replica in reps reports master_link_status
// status.
func (rc *RedisCluster) waitLinks(reps []*RedisProcess, status string) {
	rc.tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range reps {
		for {
			c := redis.NewClient(&redis.Options{Addr: n.Addr, DialTimeout: time.Second, ReadTimeout: time.Second})
			info, _ := c.Info(context.Background(), "replication").Result()
			c.Close()
			if strings.Contains(info, "master_link_status:"+status) {
				break
			}
			if time.Now().After(deadline) {
				rc.tb.Fatalf("replica %s: link not %s: %s", n.Addr, status, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
