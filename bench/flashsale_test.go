package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/examples/inventory/flashsale"
	"github.com/oncekit/oncekit/internal/testenv"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds the inventory command and its peer-lock variant once.
func binaries(b *testing.B) (oncekit, peer string) {
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "oncekit-bench-")
		if buildErr != nil {
			return
		}
		for out, pkg := range map[string]string{"inventory": "github.com/oncekit/oncekit/examples/inventory/cmd/inventory",
			"inventory-peer": "./cmd/inventory-peer"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, out), pkg)
			cmd.Stderr = os.Stderr
			if buildErr = cmd.Run(); buildErr != nil {
				return
			}
		}
	})
	if buildErr != nil {
		b.Fatal(buildErr)
	}
	return filepath.Join(binDir, "inventory"), filepath.Join(binDir, "inventory-peer")
}

var listening = regexp.MustCompile(`^replica \d+: (http://\S+)\s+grpc`)

// fleet is the replica processes of one sale.
type fleet struct {
	urls []string // the replicas' HTTP base URLs
	pids []int
}

// replicas starts n replica processes of bin with env.
func replicas(b *testing.B, n int, bin string, env []string, args ...string) fleet {
	return replicaProcesses(b, n, 1, bin, env, args...)
}

// replicaProcesses starts n processes of bin with env, each serving each
// replicas (--replicas).
func replicaProcesses(b *testing.B, n, each int, bin string, env []string, args ...string) fleet {
	var f fleet
	if each != 1 {
		args = append([]string{"--replicas", strconv.Itoa(each)}, args...)
	}
	for range n {
		want := len(f.urls) + each
		cmd := exec.Command(bin, append([]string{"--kafka", "", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		stderr, err := cmd.StderrPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		f.pids = append(f.pids, cmd.Process.Pid)
		sc := bufio.NewScanner(stderr)
		for len(f.urls) < want && sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				f.urls = append(f.urls, m[1])
			}
		}
		if len(f.urls) < want {
			b.Fatalf("%s did not start", bin)
		}
		go func() {
			for sc.Scan() {
			}
		}()
	}
	return f
}

// BenchmarkFlashSalePeers: one hot SKU, three replica processes of the
// inventory service on one Redis, its per-SKU lock taken through oncekit
// (locked, fenced), through no lock (oncekit --lock-free: the sale script
// is atomic), and through redislock and redsync (10 ms retry). One
// iteration is one buyer; stock is a fifth of the buyers; 30 % of buyers
// send their order twice. Every sale must keep its invariants.
//
//	go test -run '^$' -bench FlashSalePeers -benchtime 2000x ./...
func BenchmarkFlashSalePeers(b *testing.B) {
	oncekit, peer := binaries(b)
	store := "redis://" + testenv.RedisAddrs(b, 1)[0]
	for _, v := range []struct {
		name string
		bin  string
		env  []string
		args []string
	}{
		{"oncekit", oncekit, nil, nil},
		{"oncekit-lock-free", oncekit, nil, []string{"--lock-free"}},
		{"redislock", peer, []string{"INVENTORY_PEER_LOCK=redislock"}, nil},
		{"redsync", peer, []string{"INVENTORY_PEER_LOCK=redsync"}, nil},
	} {
		b.Run(v.name, func(b *testing.B) {
			args := append([]string{"--store", store, "--prefix", fmt.Sprintf("bench-flash:%d:", time.Now().UnixNano())}, v.args...)
			sale(b, replicas(b, 3, v.bin, v.env, args...))
		})
	}
}

// BenchmarkFlashSaleStock: the flash sale as the issue of package stock
// measures it — one hot SKU, three replica processes of the inventory
// service, lock-free (the sale is package stock's take), on Redis,
// PostgreSQL and MariaDB — beside the same sale by the inventory before
// stock (a build of INVENTORY_BASELINE, the binary scripts/bench.sh builds
// from BASELINE_REF; the baseline rows are skipped without it). One
// iteration is one buyer; stock is a fifth of the buyers; 30 % of buyers
// send their order twice. Every sale must keep its invariants. The
// ceiling row runs the same service on the in-process store (three
// replicas in one process): what the machine gives the service and its
// buyers when the store costs nothing.
//
//	go test -run '^$' -bench FlashSaleStock -benchtime 2000x ./...
func BenchmarkFlashSaleStock(b *testing.B) {
	oncekit, _ := binaries(b)
	baseline := os.Getenv("INVENTORY_BASELINE")
	stores := map[string]string{"memory": "memory://", "redis": "redis://" + testenv.RedisAddrs(b, 1)[0], "postgres": testenv.PostgresURL(b), "mysql": testenv.MySQLURL(b)}
	for _, v := range []struct{ name, bin, store string }{
		{"ceiling/memory", oncekit, "memory"},
		{"baseline/redis", baseline, "redis"},
		{"baseline/postgres", baseline, "postgres"},
		{"baseline/mysql", baseline, "mysql"},
		{"stock/redis", oncekit, "redis"},
		{"stock/postgres", oncekit, "postgres"},
		{"stock/mysql", oncekit, "mysql"},
	} {
		b.Run(v.name, func(b *testing.B) {
			if v.bin == "" {
				b.Skip("no INVENTORY_BASELINE binary")
			}
			args := []string{"--store", stores[v.store], "--lock-free", "--prefix", fmt.Sprintf("bench-stock:%d:", time.Now().UnixNano())}
			if v.store == "memory" {
				// The ceiling: the same service and buyers on the
				// in-process store (one process of three replicas, so
				// that they share it), a store that costs nothing.
				sale(b, replicaProcesses(b, 1, 3, v.bin, nil, args...))
				return
			}
			sale(b, replicas(b, 3, v.bin, nil, args...))
		})
	}
}

// sale runs a flash sale of b.N buyers against f's replicas (stock a
// fifth of the buyers, 30 % of them sending their order twice) and reports
// its metrics; a sale that broke an invariant fails b. It also reports
// where the machine's CPU went per request (µs, from /proc): the buyers
// (this process), the replica processes, and everything else — the store's
// servers, and the kernel's loopback network on their behalf.
func sale(b *testing.B, f fleet) {
	before := cpuNow(f.pids)
	b.ResetTimer()
	rep, err := flashsale.Run(context.Background(), flashsale.Config{Targets: f.urls,
		Buyers: b.N, Stock: int64(max(1, b.N/5)), DupRate: 0.3, Attempts: 60})
	b.StopTimer()
	after := cpuNow(f.pids)
	if err != nil {
		b.Fatal(err)
	}
	if !rep.OK() {
		b.Fatalf("the sale broke an invariant: %v", rep.Failures)
	}
	for unit, v := range rep.Metrics() {
		b.ReportMetric(v, unit)
	}
	if before.ok && after.ok && rep.Requests > 0 {
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(rep.Requests) }
		buyers, fleet, all := after.self-before.self, after.fleet-before.fleet, after.busy-before.busy
		b.ReportMetric(per(buyers), "buyers-cpu-µs/req")
		b.ReportMetric(per(fleet), "replicas-cpu-µs/req")
		b.ReportMetric(per(max(0, all-buyers-fleet)), "servers-cpu-µs/req")
	}
}

// cpuTimes are CPU times used so far: by this process, by the replica
// processes, and by the whole machine (busy, not idle or waiting for I/O).
type cpuTimes struct {
	self, fleet, busy time.Duration
	ok                bool // read on Linux
}

// userHZ is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const userHZ = 100

func cpuNow(pids []int) cpuTimes {
	var t cpuTimes
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return t
	}
	// cpu  user nice system idle iowait irq softirq steal ...
	line, _, _ := strings.Cut(string(stat), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return t
	}
	for i, f := range fields[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(f, 10, 64)
		t.busy += ticks(n)
	}
	for _, pid := range pids {
		t.fleet += procCPU(strconv.Itoa(pid))
	}
	t.self = procCPU("self")
	t.ok = true
	return t
}

// procCPU is the user and system time of /proc/<pid>/stat.
func procCPU(pid string) time.Duration {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: utime and stime are fields 14 and 15,
	// counted after the command's closing parenthesis (field 2).
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return ticks(u + s)
}

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }
