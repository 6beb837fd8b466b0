package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/httpmw"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// The path every request of an idempotent API or a Kafka consumer takes:
// a key nobody used before. Every case runs oncekit and its peers (or a
// hand-written control) side by side in one run, each worker with its own
// client and Store, and reports server-cmds/cycle: the servers' own count
// of commands processed (INFO stats total_commands_processed, summed over
// the servers), which counts the calls inside scripts.

// serverCommands is the sum of total_commands_processed over addrs.
func serverCommands(b *testing.B, addrs []string) int64 {
	cmds, _ := serverStats(b, addrs)
	return cmds
}

// serverStats is the sum over addrs of total_commands_processed and of
// the servers' CPU time (used_cpu_user + used_cpu_sys).
func serverStats(b *testing.B, addrs []string) (cmds int64, cpu time.Duration) {
	b.Helper()
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		info, err := c.Info(context.Background(), "stats", "cpu").Result()
		c.Close()
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok {
				continue
			}
			switch name {
			case "total_commands_processed":
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					b.Fatal(err)
				}
				cmds += n
			case "used_cpu_user", "used_cpu_sys":
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				cpu += time.Duration(f * float64(time.Second))
			}
		}
	}
	return cmds, cpu
}

// processCPU is the CPU time this process has used so far (user and
// system): per cycle, the client's cost of a library, which a machine
// whose cores the clients and the servers share turns into throughput.
func processCPU(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cycles runs b.N cycles of work spread over workers goroutines (each
// calls work with its index and a fresh cycle number) and reports cycles/s
// and the client's CPU time per cycle (this process's, the servers' not
// included) and, for Redis servers addrs (none for other stores), the
// server commands and the servers' CPU time per cycle. Each of the two INFO calls
// counts as one command; they are taken off.
func cycles(b *testing.B, addrs []string, workers int, work func(w int, i int64) error) {
	b.Helper()
	var next atomic.Int64
	var failed atomic.Value
	var cmds0 int64
	var scpu0 time.Duration
	if len(addrs) > 0 {
		cmds0, scpu0 = serverStats(b, addrs)
	}
	cpu0 := processCPU(b)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := work(w, i); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "client-cpu-µs/cycle")
	if len(addrs) > 0 {
		cmds, scpu := serverStats(b, addrs)
		b.ReportMetric(float64(cmds-cmds0-int64(len(addrs)))/float64(b.N), "server-cmds/cycle")
		b.ReportMetric(float64((scpu-scpu0).Microseconds())/float64(b.N), "server-cpu-µs/cycle")
	}
}

// BenchmarkNewKeyLock: acquire + release of a key never used before,
// every cycle, by 1 and by 16 workers, each with its own client and
// locker (16 processes), on one Redis server.
func BenchmarkNewKeyLock(b *testing.B) {
	addr := testenv.RedisAddrs(b, 1)[0]
	impls := []impl{singleNode[0], {"oncekit-unfenced", redisstoreImpl(redisstore.WithoutFencing())}, singleNode[1], singleNode[2], // oncekit, redislock, redsync
		{"oncekit-scripts-alone", scriptsAlone(b)}}
	for _, workers := range []int{1, 16} {
		for _, im := range impls {
			b.Run(fmt.Sprintf("workers=%d/%s", workers, im.name), func(b *testing.B) {
				lockers := make([]locker, workers)
				for w := range lockers {
					c, _ := client(b, addr)
					lockers[w] = im.make(b, c)
					warm(b, lockers[w], benchKey(im.name))
				}
				prefix := benchKey(im.name)
				ctx := context.Background()
				cycles(b, []string{addr}, workers, func(w int, i int64) error {
					release, err := lockers[w](ctx, prefix+":"+strconv.FormatInt(i, 10))
					if err != nil {
						return err
					}
					return release()
				})
			})
		}
	}
}

// scriptsAlone is a yardstick, not a peer: the two scripts of oncekit's
// fenced new-key cycle (the take, lua/acquire_new.lua behind its fast
// path, and the release, lua/release_new.lua) sent straight from the
// client with a fixed token, and nothing of the Store around them (lease,
// token, deadline, hand-off bookkeeping). Against "oncekit" it is the cost
// of the client's lock layer; against redislock, the scripts' own.
func scriptsAlone(b *testing.B) func(b *testing.B, c *redis.Client) locker {
	read := func(names ...string) string {
		s := ""
		for _, n := range names {
			d, err := os.ReadFile("../storage/internal/rediskit/lua/" + n + ".lua")
			if err != nil {
				b.Fatal(err)
			}
			s += string(d)
		}
		return s
	}
	take := redis.NewScript(read("acquire_fast", "fence", "acquire_new"))
	release := redis.NewScript(read("release_fast", "release_new"))
	return func(b *testing.B, c *redis.Client) locker {
		const token = "bench-token-0123456789"
		return func(ctx context.Context, key string) (func() error, error) {
			// ARGV: token, TTL ms, no deadline, fenced.
			r, err := take.Run(ctx, c, []string{key}, token, ttl.Milliseconds(), 0, 1).Int64Slice()
			if err != nil {
				return nil, err
			}
			if len(r) < 3 || r[0] != 1 {
				return nil, fmt.Errorf("scripts alone: key %s not taken: %v", key, r)
			}
			return func() error {
				// ARGV: token, no fence floor, the clock read at the take, the fence issued.
				return release.Run(ctx, c, []string{key}, token, 0, r[2], r[1]).Err()
			}, nil
		}
	}
}

// BenchmarkNewKeyRedlock: acquire + release of a new key every cycle on
// five independent servers, one worker.
func BenchmarkNewKeyRedlock(b *testing.B) {
	addrs := testenv.RedisAddrs(b, 5)[:5]
	impls := []quorumImpl{fiveNodes[0], fiveNodes[1], fiveNodes[2]} // oncekit fenced, unfenced, redsync
	for _, im := range impls {
		b.Run(im.name, func(b *testing.B) {
			lock := im.make(b, fiveClients(b, &commandCounter{}))
			warm(b, lock, benchKey(im.name))
			prefix := benchKey(im.name)
			ctx := context.Background()
			cycles(b, addrs, 1, func(_ int, i int64) error {
				release, err := lock(ctx, prefix+":"+strconv.FormatInt(i, 10))
				if err != nil {
					return err
				}
				return release()
			})
		})
	}
}

// doer is one way of running a request once per key: Guard.Do, or the
// hand-written control.
type doer func(ctx context.Context, key string, run func() []byte) (res []byte, replayed bool, err error)

// controlDoer is what a hand-written idempotency middleware does: SET NX
// PX to claim the key (no fence, no watchdog, no fingerprint check), the
// run, SET PX to store the result; a key already claimed is read back
// with GET (a replay).
func controlDoer(c *redis.Client, prefix string) doer {
	return func(ctx context.Context, key string, run func() []byte) ([]byte, bool, error) {
		name := prefix + key
		ok, err := c.SetNX(ctx, name, "", 30*time.Second).Result()
		if err != nil {
			return nil, false, err
		}
		if !ok {
			v, err := c.Get(ctx, name).Bytes()
			return v, true, err
		}
		res := run()
		return res, false, c.Set(ctx, name, res, 24*time.Hour).Err()
	}
}

// lockedDoer is the careful hand-written version: the stored result is
// read first (a replay is one GET); a miss takes a bsm/redislock lock on
// the key, reads again (a run that finished meanwhile), runs, stores the
// result and unlocks — five round trips for a new key. The lock keeps two
// runs of one key apart, which a bare SET NX claim does only until its
// TTL, with nothing to tell the run that it ran out.
func lockedDoer(c *redis.Client, prefix string) doer {
	rl := redislock.New(c)
	return func(ctx context.Context, key string, run func() []byte) ([]byte, bool, error) {
		name := prefix + key
		if v, err := c.Get(ctx, name).Bytes(); err == nil {
			return v, true, nil
		} else if !errors.Is(err, redis.Nil) {
			return nil, false, err
		}
		l, err := rl.Obtain(ctx, name+":lock", 30*time.Second, nil)
		if err != nil {
			return nil, false, err
		}
		defer l.Release(context.WithoutCancel(ctx))
		if v, err := c.Get(ctx, name).Bytes(); err == nil {
			return v, true, nil
		} else if !errors.Is(err, redis.Nil) {
			return nil, false, err
		}
		res := run()
		return res, false, c.Set(ctx, name, res, 24*time.Hour).Err()
	}
}

// redisGuard is a Guard over a redisstore Store on c, its records under a
// prefix of their own.
func redisGuard(b *testing.B, c *redis.Client, name string) *idem.Guard {
	b.Helper()
	st, err := redisstore.New(c, redisstore.WithRecordPrefix(benchKey(name)+":"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	g, err := idem.NewGuard(st)
	if err != nil {
		b.Fatal(err)
	}
	return g
}

func guardDoer(b *testing.B, c *redis.Client) doer {
	g := redisGuard(b, c, "guard")
	return func(ctx context.Context, key string, run func() []byte) ([]byte, bool, error) {
		return g.Do(ctx, key, "fp", func(context.Context) ([]byte, error) { return run(), nil })
	}
}

// BenchmarkNewKeyGuard: idem.Guard.Do on redisstore against the
// hand-written controls (a bare SET NX claim, and the careful version
// under a redislock lock), for a new key every call and for a replay of a
// completed key, by 1 and 16 workers each with its own client.
func BenchmarkNewKeyGuard(b *testing.B) {
	addr := testenv.RedisAddrs(b, 1)[0]
	result := []byte(`{"order":1001}`)
	run := func() []byte { return result }
	impls := []struct {
		name string
		make func(b *testing.B, c *redis.Client) doer
	}{
		{"oncekit", guardDoer},
		{"control", func(b *testing.B, c *redis.Client) doer { return controlDoer(c, benchKey("control")+":") }},
		{"control-locked", func(b *testing.B, c *redis.Client) doer { return lockedDoer(c, benchKey("control-locked")+":") }},
	}
	for _, mode := range []string{"new", "replay"} {
		for _, workers := range []int{1, 16} {
			for _, im := range impls {
				b.Run(fmt.Sprintf("%s/workers=%d/%s", mode, workers, im.name), func(b *testing.B) {
					doers := make([]doer, workers)
					ctx := context.Background()
					replayKey := idemdriver.ScopedKey("bench", benchKey("replay"))
					for w := range doers {
						c, _ := client(b, addr)
						doers[w] = im.make(b, c)
						if _, _, err := doers[w](ctx, replayKey, run); err != nil { // loads scripts
							b.Fatal(err)
						}
					}
					prefix := benchKey("new")
					cycles(b, []string{addr}, workers, func(w int, i int64) error {
						k := replayKey
						if mode == "new" {
							k = idemdriver.ScopedKey("bench", prefix+strconv.FormatInt(i, 10))
						}
						_, replayed, err := doers[w](ctx, k, run)
						if err == nil && replayed != (mode == "replay") {
							err = fmt.Errorf("key %s: replayed=%v", k, replayed)
						}
						return err
					})
				})
			}
		}
	}
}

// BenchmarkNewKeyHTTP: requests through httpmw on redisstore against a
// control handler that makes the same round trips itself with plain
// commands (SET NX PX, then SET PX for a new key; one GET for a replay),
// by 1 and 16 clients at once (in-process requests: the network between
// client and service is not measured). added-p50-µs is a request's p50
// minus the bare handler's p50, measured in the same run.
func BenchmarkNewKeyHTTP(b *testing.B) {
	addr := testenv.RedisAddrs(b, 1)[0]
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"order":1001}`)
	})
	// control is the bare handler behind a hand-written middleware.
	control := func(c *redis.Client, replay bool) http.Handler {
		prefix := benchKey("http-control") + ":"
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, name := r.Context(), prefix+r.Header.Get("Idempotency-Key")
			if replay {
				if _, err := c.Get(ctx, name).Bytes(); err != nil && !errors.Is(err, redis.Nil) {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				bare(w, r)
				return
			}
			if err := c.SetNX(ctx, name, "", 30*time.Second).Err(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			bare(w, r)
			if err := c.Set(ctx, name, `{"order":1001}`, 24*time.Hour).Err(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		})
	}
	middleware := func(b *testing.B, c *redis.Client) http.Handler {
		mw, err := httpmw.New(redisGuard(b, c, "httpmw"), httpmw.Unscoped())
		if err != nil {
			b.Fatal(err)
		}
		return mw(bare)
	}
	serve := func(h http.Handler, key string) int {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"phone-x"}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	for _, mode := range []string{"new-key", "replay"} {
		for _, clients := range []int{1, 16} {
			for _, name := range []string{"oncekit", "control"} {
				b.Run(fmt.Sprintf("%s/clients=%d/%s", mode, clients, name), func(b *testing.B) {
					handlers := make([]http.Handler, clients)
					for i := range handlers {
						c, _ := client(b, addr)
						if name == "oncekit" {
							handlers[i] = middleware(b, c)
						} else {
							handlers[i] = control(c, mode == "replay")
						}
					}
					prefix := benchKey("k")
					for _, h := range handlers {
						serve(h, prefix+"replay") // completes the replay key; loads the scripts
					}
					bareP50 := p50us(latencies(2000, 1, func(int, int64) { serve(bare, "") }))
					var mu sync.Mutex
					var samples []time.Duration
					cycles(b, []string{addr}, clients, func(w int, i int64) error {
						key := prefix + "replay"
						if mode == "new-key" {
							key = prefix + strconv.FormatInt(i, 10)
						}
						start := time.Now()
						if code := serve(handlers[w], key); code != http.StatusCreated {
							return fmt.Errorf("status %d", code)
						}
						d := time.Since(start)
						mu.Lock()
						samples = append(samples, d)
						mu.Unlock()
						return nil
					})
					b.ReportMetric(p50us(samples)-bareP50, "added-p50-µs")
				})
			}
		}
	}
}

// latencies times n calls of f spread over workers goroutines.
func latencies(n, workers int, f func(w int, i int64)) []time.Duration {
	out := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				start := time.Now()
				f(w, i)
				out[i] = time.Since(start)
			}
		})
	}
	wg.Wait()
	return out
}
