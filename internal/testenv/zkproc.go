package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ZooKeeperMember is one ZooKeeper server a test starts for itself, to
// kill, restart and cut off from its peers.
type ZooKeeperMember struct {
	tb   testing.TB
	ID   int
	Addr string // client address
	dir  string
	cmd  *exec.Cmd
	// links are the proxies on this member's connections to and from its
	// peers (quorum and election ports), which Partition stalls.
	links []*Proxy
}

// StartZooKeeper starts an ensemble of n members (Debian's zookeeper
// package) on free 127.0.0.1 ports, with tickTime 200 ms (sessions of
// 400 ms to 4 s), TTL nodes enabled, and every connection between two
// members through a proxy of its own, so that one member can be cut off
// from the others (Partition). It waits until every member serves, and
// stops them at cleanup. It skips (fails under ONCEKIT_REQUIRE_SERVERS=1)
// when ZooKeeper or Java is not installed.
func StartZooKeeper(tb testing.TB, n int) []*ZooKeeperMember {
	tb.Helper()
	skipShort(tb)
	const jar = "/usr/share/java/zookeeper.jar"
	_, errJava := exec.LookPath("java")
	if _, err := os.Stat(jar); err != nil || errJava != nil {
		msg := "ZooKeeper or Java not installed (make services-up installs them)"
		if Required() {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	type ports struct{ client, quorum, election int }
	ps := make([]ports, n)
	for i := range ps {
		ps[i] = ports{freePort(tb), freePort(tb), freePort(tb)}
	}
	members := make([]*ZooKeeperMember, n)
	for i := range members {
		members[i] = &ZooKeeperMember{tb: tb, ID: i + 1, Addr: fmt.Sprintf("127.0.0.1:%d", ps[i].client), dir: tb.TempDir()}
	}
	for i, m := range members {
		var servers []string
		for j, p := range ps {
			if j == i {
				servers = append(servers, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", j+1, p.quorum, p.election))
				continue
			}
			// i reaches j through proxies that belong to both: cutting
			// either off stalls them.
			q := StartPeerProxy(tb, fmt.Sprintf("127.0.0.1:%d", p.quorum))
			e := StartPeerProxy(tb, fmt.Sprintf("127.0.0.1:%d", p.election))
			m.links = append(m.links, q, e)
			members[j].links = append(members[j].links, q, e)
			servers = append(servers, fmt.Sprintf("server.%d=%s:%s", j+1, q.Addr, portOf(e.Addr)))
		}
		data := filepath.Join(m.dir, "data")
		if err := os.MkdirAll(data, 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(data, "myid"), []byte(fmt.Sprint(m.ID)), 0o644); err != nil {
			tb.Fatal(err)
		}
		cfg := fmt.Sprintf("tickTime=200\ninitLimit=50\nsyncLimit=10\ndataDir=%s\nclientPortAddress=127.0.0.1\nclientPort=%d\n"+
			"maxClientCnxns=0\nadmin.enableServer=false\n4lw.commands.whitelist=srvr,ruok\nstandaloneEnabled=false\n"+
			"reconfigEnabled=false\n%s\n", data, ps[i].client, strings.Join(servers, "\n"))
		if err := os.WriteFile(filepath.Join(m.dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
			tb.Fatal(err)
		}
		log4j := fmt.Sprintf("log4j.rootLogger=WARN, F\nlog4j.appender.F=org.apache.log4j.FileAppender\nlog4j.appender.F.File=%s\n"+
			"log4j.appender.F.layout=org.apache.log4j.PatternLayout\nlog4j.appender.F.layout.ConversionPattern=%%d %%p %%c{1}: %%m%%n\n",
			filepath.Join(m.dir, "zk.log"))
		if err := os.WriteFile(filepath.Join(m.dir, "log4j.properties"), []byte(log4j), 0o644); err != nil {
			tb.Fatal(err)
		}
		m.Start()
		tb.Cleanup(m.Kill)
	}
	for _, m := range members {
		m.WaitServing(60 * time.Second) // a loaded make test can take most of a minute
	}
	return members
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// Start starts the member (again) with its data directory.
func (m *ZooKeeperMember) Start() {
	m.tb.Helper()
	log, err := os.OpenFile(filepath.Join(m.dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		m.tb.Fatal(err)
	}
	defer log.Close()
	// Election notifications back off to at most a second (ZooKeeper's
	// default is a minute): a member cut off for a while rejoins soon
	// after the partition ends.
	m.cmd = exec.Command("java", "-Xmx256m", "-Dzookeeper.extendedTypesEnabled=true", "-Dznode.container.checkIntervalMs=1000",
		"-Dzookeeper.fastleader.maxNotificationInterval=1000",
		"-Dlog4j.configuration=file:"+filepath.Join(m.dir, "log4j.properties"),
		"-cp", m.dir+":/usr/share/java/zookeeper.jar"+zkLogJars(),
		"org.apache.zookeeper.server.quorum.QuorumPeerMain", filepath.Join(m.dir, "zoo.cfg"))
	m.cmd.Stdout, m.cmd.Stderr = log, log
	if err := m.cmd.Start(); err != nil {
		m.tb.Fatalf("start zookeeper %d: %v", m.ID, err)
	}
}

// zkLogJars are the classpath entries that route ZooKeeper's logging
// (SLF4J) to log4j and so to the member's zk.log, when Debian's packages
// have them; without them SLF4J logs nothing.
func zkLogJars() string {
	var cp string
	for _, jar := range []string{"/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar"} {
		if _, err := os.Stat(jar); err != nil {
			return ""
		}
		cp += ":" + jar
	}
	return cp
}

// Kill stops the member with SIGKILL and waits for it to exit.
func (m *ZooKeeperMember) Kill() {
	if m.cmd == nil || m.cmd.Process == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGCONT)
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
	m.cmd = nil
}

// Partition cuts the member off from its peers: every connection between
// them holds its bytes, as a network partition does. Its clients still
// reach it; a member without a quorum stops serving them.
func (m *ZooKeeperMember) Partition() {
	for _, l := range m.links {
		l.Stall()
	}
}

// Heal ends a Partition.
func (m *ZooKeeperMember) Heal() {
	for _, l := range m.links {
		l.Resume()
	}
}

// Mode is what the member says it is ("leader", "follower"), or "" when
// it does not serve.
func (m *ZooKeeperMember) Mode() string {
	c, err := net.DialTimeout("tcp", m.Addr, time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("srvr")); err != nil {
		return ""
	}
	var b strings.Builder
	buf := make([]byte, 1024)
	for {
		n, err := c.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	for line := range strings.SplitSeq(b.String(), "\n") {
		if mode, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(mode)
		}
	}
	return ""
}

// WaitServing waits until the member serves as leader or follower.
func (m *ZooKeeperMember) WaitServing(timeout time.Duration) {
	m.tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if mode := m.Mode(); mode == "leader" || mode == "follower" {
			return
		}
		if time.Now().After(deadline) {
			m.tb.Fatalf("zookeeper %d at %s not serving after %s (mode %q)\nzk.log:\n%s\nstdout.log:\n%s",
				m.ID, m.Addr, timeout, m.Mode(), m.logTail("zk.log"), m.logTail("stdout.log"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// logTail is the end of one of the member's log files.
func (m *ZooKeeperMember) logTail(name string) []byte {
	log, _ := os.ReadFile(filepath.Join(m.dir, name))
	if len(log) > 3000 {
		log = log[len(log)-3000:]
	}
	return log
}

// ZooKeeperLeader returns the member that says it leads, waiting up to
// 60 s for an election to settle (a few seconds alone; a machine busy
// with every package's tests has taken over 20 s). It fails with each
// member's mode and log when none leads by then.
func ZooKeeperLeader(tb testing.TB, members []*ZooKeeperMember) *ZooKeeperMember {
	tb.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		for _, m := range members {
			if m.cmd != nil && m.Mode() == "leader" {
				return m
			}
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, m := range members {
				fmt.Fprintf(&b, "\nzookeeper %d at %s (running %t, mode %q)\nzk.log:\n%s\n", m.ID, m.Addr, m.cmd != nil, m.Mode(), m.logTail("zk.log"))
			}
			tb.Fatalf("no zookeeper member leads after 60 s%s", b.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
