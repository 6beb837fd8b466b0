package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

var listening = regexp.MustCompile(`^replica 1: (http://\S+)\s+grpc`)

// replicas starts n replica processes of bin with env and returns their
// HTTP base URLs.
func replicas(b *testing.B, n int, bin string, env []string, args ...string) []string {
	var urls []string
	for range n {
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
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				urls = append(urls, m[1])
				break
			}
		}
		if len(urls) == 0 {
			b.Fatalf("%s did not start", bin)
		}
		go func() {
			for sc.Scan() {
			}
		}()
	}
	return urls
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
// send their order twice. Every sale must keep its invariants.
//
//	go test -run '^$' -bench FlashSaleStock -benchtime 2000x ./...
func BenchmarkFlashSaleStock(b *testing.B) {
	oncekit, _ := binaries(b)
	baseline := os.Getenv("INVENTORY_BASELINE")
	stores := map[string]string{"redis": "redis://" + testenv.RedisAddrs(b, 1)[0], "postgres": testenv.PostgresURL(b), "mysql": testenv.MySQLURL(b)}
	for _, v := range []struct{ name, bin, store string }{
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
			sale(b, replicas(b, 3, v.bin, nil, args...))
		})
	}
}

// sale runs a flash sale of b.N buyers against targets (stock a fifth of
// the buyers, 30 % of them sending their order twice) and reports its
// metrics; a sale that broke an invariant fails b.
func sale(b *testing.B, targets []string) {
	b.ResetTimer()
	rep, err := flashsale.Run(context.Background(), flashsale.Config{Targets: targets,
		Buyers: b.N, Stock: int64(max(1, b.N/5)), DupRate: 0.3, Attempts: 60})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if !rep.OK() {
		b.Fatalf("the sale broke an invariant: %v", rep.Failures)
	}
	for unit, v := range rep.Metrics() {
		b.ReportMetric(v, unit)
	}
}
