package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
)

// verifyWorkerEnv, when set (to the worker's JSON configuration), makes
// oncectl a verify worker: a process of its own that takes the locks and
// claims the keys verify reports on. verify starts them; a user never does.
const verifyWorkerEnv = "ONCECTL_VERIFY_WORKER"

// workerConfig is what verify tells a worker.
type workerConfig struct {
	Name    string        `json:"name"`
	Store   string        `json:"store"`
	Prefix  string        `json:"prefix"`
	Keys    int           `json:"keys"`
	TTL     time.Duration `json:"ttl"`
	Timeout time.Duration `json:"timeout"`
	Start   int64         `json:"start"` // the run's start, Unix ns: claim keys are slots of time since
}

// event is one line a worker writes: what it did, with the wall-clock
// times (Unix ns; one machine's clock for every worker) verify orders
// the history by. read and write ask the register and wait for its
// answer (a reply line).
type event struct {
	T      string `json:"t"` // acquired, read, write, released, claim-start, claim-end, error
	Worker string `json:"w,omitempty"`
	Key    string `json:"k,omitempty"`
	Fence  uint64 `json:"f,omitempty"`
	At     int64  `json:"at,omitempty"`  // acquired: Acquire returned; released: the hold's end; claim: the call
	Ret    int64  `json:"ret,omitempty"` // claim-end: the call returned; acquired: the lease's Deadline
	Took   int64  `json:"took,omitempty"`
	Read   int64  `json:"read,omitempty"`
	Value  int64  `json:"v,omitempty"`
	Answer string `json:"a,omitempty"` // claim: the proposal (start) or the answer (end)
	Replay bool   `json:"rp,omitempty"`
	Err    string `json:"err,omitempty"`
}

// reply is the register's answer to read or write.
type reply struct {
	OK    bool  `json:"ok"`
	Value int64 `json:"v"`
}

// runVerifyWorker is a verify worker's life: lock a key, read and write
// the register under the lease's fence, release; claim a key, new or one
// another worker claims too; until verify closes its input.
func runVerifyWorker(cfgJSON string, in io.Reader, out io.Writer) int {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "oncectl verify worker:", err)
		return exitUsage
	}
	st, err := openStore(cfg.Store, cfg.Timeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "oncectl verify worker:", err)
		return exitUsage
	}
	defer st.close()
	g, err := idem.NewGuard(st.full)
	if err != nil {
		fmt.Fprintln(os.Stderr, "oncectl verify worker:", err)
		return exitUsage
	}
	w := &worker{cfg: cfg, locker: st.full, guard: g, enc: json.NewEncoder(out), replies: make(chan reply)}
	stopped := make(chan struct{})
	go func() { // replies, and the end of the input: stop
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			var r reply
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				w.replies <- r
			}
		}
		close(stopped)
	}()
	w.send(event{T: "ready"})
	for seq := 0; ; seq++ {
		select {
		case <-stopped:
			return exitOK
		default:
		}
		if !w.hold(stopped) {
			return exitOK
		}
		w.claim(seq)
	}
}

type worker struct {
	cfg     workerConfig
	locker  lock.Locker
	guard   *idem.Guard
	mu      sync.Mutex
	enc     *json.Encoder
	replies chan reply
}

func (w *worker) send(e event) {
	e.Worker = w.cfg.Name
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = w.enc.Encode(e)
}

// ask sends e and waits for the register's answer; false when verify
// has stopped.
func (w *worker) ask(e event, stopped <-chan struct{}) (reply, bool) {
	w.send(e)
	select {
	case r := <-w.replies:
		return r, true
	case <-stopped:
		return reply{}, false
	}
}

// hold takes one lock key, reads the register, works a little, writes
// the value it read plus one, and releases.
func (w *worker) hold(stopped <-chan struct{}) bool {
	key := "lock-" + strconv.Itoa(rand.N(w.cfg.Keys))
	ctx, cancel := context.WithTimeout(context.Background(), 4*w.cfg.TTL+10*time.Second)
	defer cancel()
	start := time.Now()
	l, err := w.locker.Acquire(ctx, w.cfg.Prefix+key, w.cfg.TTL)
	if err != nil {
		w.send(event{T: "error", Key: key, Err: "acquire: " + err.Error()})
		time.Sleep(10 * time.Millisecond)
		return true
	}
	now := time.Now()
	w.send(event{T: "acquired", Key: key, Fence: l.Fence(), At: now.UnixNano(), Ret: l.Deadline().UnixNano(), Took: int64(now.Sub(start))})
	r, ok := w.ask(event{T: "read", Key: key, Fence: l.Fence()}, stopped)
	if ok && r.OK {
		time.Sleep(time.Duration(1+rand.N(4)) * time.Millisecond) // the work
		_, ok = w.ask(event{T: "write", Key: key, Fence: l.Fence(), Read: r.Value, Value: r.Value + 1}, stopped)
		time.Sleep(time.Duration(1+rand.N(3)) * time.Millisecond) // what follows the write, still holding
	}
	end := time.Now()
	if dl := l.Deadline(); dl.Before(end) {
		end = dl // the lease ended before its holder let go
	}
	if err := l.Release(context.Background()); err != nil && !errors.Is(err, lock.ErrLockLost) {
		w.send(event{T: "error", Key: key, Err: "release: " + err.Error()})
	}
	w.send(event{T: "released", Key: key, Fence: l.Fence(), At: end.UnixNano()})
	return ok
}

// claim runs Guard.Do on a key of the current slot of time (a new slot
// every 100 ms, four keys each): the first worker to claim a key runs it
// and proposes its own answer; every other claim of it, by this worker
// or another, concurrent or later, must get that answer back.
func (w *worker) claim(seq int) {
	slot := (time.Now().UnixNano() - w.cfg.Start) / int64(100*time.Millisecond)
	key := fmt.Sprintf("claim-%d-%d", slot, rand.N(4))
	proposal := fmt.Sprintf("%s#%d", w.cfg.Name, seq)
	call := time.Now()
	w.send(event{T: "claim-start", Key: key, Answer: proposal, At: call.UnixNano()})
	ctx, cancel := context.WithTimeout(context.Background(), 4*w.cfg.TTL+10*time.Second)
	defer cancel()
	res, replayed, err := w.guard.Do(ctx, w.cfg.Prefix+key, "", func(context.Context) ([]byte, error) {
		return []byte(proposal), nil
	})
	ret := time.Now()
	e := event{T: "claim-end", Key: key, At: call.UnixNano(), Ret: ret.UnixNano(), Took: int64(ret.Sub(call)), Answer: string(res), Replay: replayed}
	if err != nil {
		e.Err = err.Error()
		if errors.Is(err, idem.ErrInFlight) {
			e.Err = "in flight"
		}
	}
	w.send(e)
}
