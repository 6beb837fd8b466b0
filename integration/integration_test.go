package integration_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/oncekit/oncekit/examples/inventory/flashsale"
	"github.com/oncekit/oncekit/internal/testenv"
)

// inventoryBin is the inventory service and oncectlBin the command-line
// tool, built once for every test.
var inventoryBin, oncectlBin string

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		runWorker()
		return
	}
	if os.Getenv(roleEnv) != "" {
		runRoleWorker()
		return
	}
	dir, err := os.MkdirTemp("", "oncekit-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	inventoryBin, oncectlBin = filepath.Join(dir, "inventory"), filepath.Join(dir, "oncectl")
	for bin, pkg := range map[string]string{inventoryBin: "../examples/inventory/cmd/inventory", oncectlBin: "../cmd/oncectl"} {
		build := exec.Command("go", "build", "-o", bin, pkg)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build", pkg+":", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// stores are the store URLs of the servers `make services-up` runs.
func stores(t testing.TB) map[string]string {
	redis := testenv.RedisAddrs(t, 5)
	return map[string]string{
		"redis":    "redis://" + redis[0],
		"redlock":  "redlock://" + strings.Join(redis, ","),
		"etcd":     "etcd://" + strings.Join(testenv.EtcdAddrs(t), ","),
		"postgres": testenv.PostgresURL(t),
		"mysql":    testenv.MySQLURL(t),
		"zk":       "zk://" + strings.Join(testenv.ZooKeeperAddrs(t), ","),
	}
}

func eachStore(t *testing.T, f func(t *testing.T, url string)) {
	for _, name := range []string{"redis", "redlock", "etcd", "postgres", "mysql", "zk"} {
		url := stores(t)[name]
		t.Run(name, func(t *testing.T) { f(t, url) })
	}
}

// deployment is a run's namespace in the shared servers and its replicas.
type deployment struct {
	t                        testing.TB
	store, brokers           string
	prefix, topic, group     string
	flags                    []string // the replicas' extra flags
	replicas                 []*replica
	httpTargets, grpcTargets []string
	sold                     atomic.Int64 // orders the running sale confirmed (waitOrders)
}

type replica struct {
	cmd        *exec.Cmd
	http, grpc string
	mu         sync.Mutex
	log        strings.Builder
	exited     chan struct{}
}

func deploy(t testing.TB, store string, n int, flags ...string) *deployment {
	run := fmt.Sprintf("it-%d", time.Now().UnixNano())
	d := &deployment{t: t, store: store, flags: flags, brokers: strings.Join(testenv.KafkaBrokers(t), ","),
		prefix: "inventory:" + run + ":", topic: "order.created." + run, group: "shipping." + run}
	for range n {
		r := d.start()
		d.replicas = append(d.replicas, r)
		d.httpTargets = append(d.httpTargets, "http://"+r.http)
		d.grpcTargets = append(d.grpcTargets, r.grpc)
	}
	d.waitGroupStable(n)
	return d
}

// waitGroupStable waits until the shipping group is stable with n members,
// and a moment more for the followers' SyncGroup. kfake never expires a
// member that dies after its JoinGroup and before its SyncGroup (its session
// timer is not armed until it syncs), so a replica killed in that window
// would keep its partitions for ever; a Kafka broker would expire it after
// its session timeout. Faults are injected once the group has settled.
func (d *deployment) waitGroupStable(n int) {
	addr, err := net.ResolveTCPAddr("tcp", strings.Split(d.brokers, ",")[0])
	if err != nil {
		d.t.Fatal(err)
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	c := &kafka.Client{Addr: addr, Transport: tr}
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res, err := c.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{d.group}})
		cancel()
		if err == nil && len(res.Groups) == 1 && res.Groups[0].GroupState == "Stable" && len(res.Groups[0].Members) == n {
			time.Sleep(500 * time.Millisecond)
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("shipping group %s not stable with %d members after a minute (%v, %+v)", d.group, n, err, res)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var listening = regexp.MustCompile(`^replica 1: http://(\S+)\s+grpc (\S+)$`)

// start runs a replica process and waits until it listens.
func (d *deployment) start() *replica {
	t := d.t
	cmd := exec.Command(inventoryBin, append([]string{"--store", d.store, "--kafka", d.brokers, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
		"--prefix", d.prefix, "--topic", d.topic, "--group", d.group}, d.flags...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{cmd: cmd, exited: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			r.mu.Lock()
			r.log.WriteString(line + "\n")
			r.mu.Unlock()
			if m := listening.FindStringSubmatch(line); m != nil {
				r.http, r.grpc = m[1], m[2]
				ready <- nil
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		ready <- fmt.Errorf("replica exited before it listened")
	}()
	go func() { _ = cmd.Wait(); close(r.exited) }()
	select {
	case err := <-ready:
		if err != nil {
			<-r.exited
			t.Fatalf("%v:\n%s", err, r.output())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("replica not listening after 30 s:\n%s", r.output())
	}
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *replica) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.String()
}

// stop ends a replica gracefully (SIGTERM), or kills it after 20 s.
func (r *replica) stop(t testing.TB) {
	select {
	case <-r.exited:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(20 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.exited
		t.Errorf("replica %s did not stop on SIGTERM:\n%s", r.http, r.output())
	}
}

// kill ends a replica with SIGKILL: no clean-up of any kind.
func (r *replica) kill() {
	_ = r.cmd.Process.Kill()
	<-r.exited
}

// sale runs a flash sale against every replica, HTTP and gRPC.
func (d *deployment) sale(buyers int, stock int64, dupRate float64) *flashsale.Report {
	d.t.Helper()
	return d.saleOf("", buyers, stock, dupRate)
}

// saleOf is sale of a chosen SKU ("": a new one).
func (d *deployment) saleOf(sku string, buyers int, stock int64, dupRate float64) *flashsale.Report {
	d.t.Helper()
	rep, err := flashsale.Run(context.Background(), flashsale.Config{
		Targets: d.httpTargets, GRPC: d.grpcTargets, SKU: sku, Buyers: buyers, Stock: stock, DupRate: dupRate,
		Shipping: time.Minute, Attempts: 60, Confirmed: d.sold.Store,
	})
	if err != nil {
		d.t.Fatal(err)
	}
	return rep
}

func (d *deployment) check(rep *flashsale.Report) {
	d.t.Helper()
	var out strings.Builder
	rep.Print(&out)
	d.t.Logf("report:\n%s", out.String())
	if !rep.OK() {
		for i, r := range d.replicas {
			d.t.Logf("replica %d log:\n%s\nstats: %s", i+1, r.output(), stats(d.httpTargets[i]))
		}
		d.t.Fatal("the flash sale broke an invariant")
	}
}

// stats is a replica's /v1/stats as it says it.
func stats(target string) string {
	resp, err := http.Get(target + "/v1/stats")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// waitOrders waits until the running sale has confirmed at least n
// orders, as its buyers see them (not by asking a replica, whose answer
// waits behind the sale's own requests for a connection to the store).
func (d *deployment) waitOrders(n int64) int64 {
	deadline := time.Now().Add(time.Minute)
	for {
		if got := d.sold.Load(); got >= n {
			return got
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("fewer than %d orders after a minute", n)
		}
		time.Sleep(time.Millisecond)
	}
}
