package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/anishathalye/porcupine"
)

// verify is a bounded acceptance test of the store: worker processes of
// oncectl's own lock a few keys and keep a fenced register (here, in this
// process: the judge is not the store it judges), claim new and duplicate
// keys with Guard.Do, and one of them is killed while it holds a key. The
// report says whether exclusion, fences and single execution held, how
// long the dead holder's key took to free, and how fast it all went. Every
// key is under a prefix of the run's own (oncectl-verify/<run>/), and the
// records and locks it leaves are deleted at the end.
func (c *cli) verify() int {
	if c.ttl == 0 {
		c.ttl = 2 * time.Second
	}
	if c.verifyFor <= 0 || c.workers < 2 || c.keys < 1 || c.ttl <= 0 {
		return c.usageErr("verify needs --for > 0, --workers ≥ 2, --keys ≥ 1 and --ttl > 0")
	}
	st, err := openStore(c.storeURL, c.timeout)
	if err != nil {
		fmt.Fprintf(c.err, "oncectl: %v\n", err)
		return exitUsage
	}
	defer st.close()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	err = st.Ping(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(c.err, "oncectl: verify: %v\n", err)
		return exitUsage
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	v := &verifyRun{
		cfg: workerConfig{Store: c.storeURL, Prefix: "oncectl-verify/" + hex.EncodeToString(id[:]) + "/",
			Keys: c.keys, TTL: c.ttl, Timeout: c.timeout, Start: time.Now().UnixNano()},
		regs: map[string]*vregister{}, open: map[string]*vhold{}, claiming: map[string]*vclaim{},
		lat: map[string][]time.Duration{}, workers: map[string]*vworker{},
	}
	rep, err := v.run(c.verifyFor, c.workers)
	v.cleanup(st)
	if err != nil {
		fmt.Fprintf(c.err, "oncectl: verify: %v\n", err)
		return exitUsage
	}
	rep.Store = redactURL(c.storeURL)
	if c.html != "" {
		if err := v.writeHTML(c.html, rep); err != nil {
			fmt.Fprintf(c.err, "oncectl: verify: %v\n", err)
			return exitUsage
		}
	}
	if c.json {
		_ = json.NewEncoder(c.out).Encode(rep)
	} else {
		rep.print(c.out)
	}
	if !rep.Pass {
		return exitFail
	}
	return exitOK
}

// verifyRun is one run's workers and everything they reported.
type verifyRun struct {
	cfg workerConfig

	mu         sync.Mutex
	workers    map[string]*vworker
	regs       map[string]*vregister // by lock key
	holds      []*vhold
	open       map[string]*vhold // by worker: its hold now
	claims     []*vclaim
	claiming   map[string]*vclaim // by worker: its claim in flight
	lat        map[string][]time.Duration
	errs       []string
	nerrs      int
	kill       *killed
	killWanted bool
	started    time.Time
	ended      time.Time
}

type vworker struct {
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	enc   *json.Encoder
	done  chan struct{} // its output ended
	dead  bool          // killed on purpose
	ready chan struct{}
}

// vregister is a fenced register: it refuses a read or write whose fence
// is below the highest it has seen, as a resource guarded by
// lock.FenceGate does.
type vregister struct {
	value    int64
	maxFence uint64
	accepted int
	refused  int
	lost     int // writes accepted that were based on a value no longer current
}

// vhold is one lease of a lock key, as its worker reported it.
type vhold struct {
	Worker  string `json:"worker"`
	Key     string `json:"key"`
	Fence   uint64 `json:"fence"`
	From    int64  `json:"from"` // Unix ns: Acquire returned
	To      int64  `json:"to"`   // Unix ns: its holder let go, or its lease ended
	Wrote   bool   `json:"wrote"`
	Refused bool   `json:"refused"` // a read or write refused by fence
	Killed  bool   `json:"killed,omitempty"`

	Deadline int64 `json:"-"` // Unix ns: the lease's Deadline, as its holder knew it
}

// vclaim is one Guard.Do call.
type vclaim struct {
	worker, key, proposal, answer string
	call, ret                     int64
	replay, done                  bool
	err                           string
}

type killed struct {
	Worker string        `json:"worker"`
	Key    string        `json:"key"`
	At     time.Time     `json:"at"`
	Freed  time.Duration `json:"freed_after"` // until another worker held the key; 0: not within the run
}

// run starts the workers, kills one mid-hold a third of the way through,
// stops the rest after d and judges what they reported.
func (v *verifyRun) run(d time.Duration, n int) (*verifyReport, error) {
	for i := range n {
		if err := v.spawn(fmt.Sprintf("w%d", i+1)); err != nil {
			v.stopAll()
			return nil, err
		}
	}
	for _, w := range v.workers {
		select {
		case <-w.ready:
		case <-w.done:
			v.stopAll()
			return nil, fmt.Errorf("worker %s ended before it was ready: %s", w.name, v.firstError())
		case <-time.After(30 * time.Second):
			v.stopAll()
			return nil, fmt.Errorf("worker %s not ready after 30 s", w.name)
		}
	}
	v.mu.Lock()
	v.started = time.Now()
	v.mu.Unlock()
	time.Sleep(d / 3)
	v.killHolder(d / 3)
	time.Sleep(time.Until(v.started.Add(d)))
	v.stopAll()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.ended = time.Now()
	return v.judge(d, n), nil
}

func (v *verifyRun) spawn(name string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cfg := v.cfg
	cfg.Name = name
	b, _ := json.Marshal(cfg)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), verifyWorkerEnv+"="+string(b))
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	w := &vworker{name: name, cmd: cmd, in: in, enc: json.NewEncoder(in), done: make(chan struct{}), ready: make(chan struct{})}
	v.mu.Lock()
	v.workers[name] = w
	v.mu.Unlock()
	go func() { // a worker's own complaints (it could not open the store)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			v.mu.Lock()
			v.errorf("%s: %s", name, sc.Text())
			v.mu.Unlock()
		}
	}()
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				continue
			}
			if e.T == "ready" {
				close(w.ready)
				continue
			}
			v.handle(w, e)
		}
	}()
	return nil
}

func (v *verifyRun) errorf(format string, args ...any) {
	v.nerrs++
	if len(v.errs) < 5 {
		v.errs = append(v.errs, fmt.Sprintf(format, args...))
	}
}

func (v *verifyRun) firstError() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.errs) == 0 {
		return "no error reported"
	}
	return v.errs[0]
}

// handle takes one event of worker w and answers a read or a write.
func (v *verifyRun) handle(w *vworker, e event) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch e.T {
	case "acquired":
		h := &vhold{Worker: w.name, Key: e.Key, Fence: e.Fence, From: e.At, Deadline: e.Ret}
		v.holds = append(v.holds, h)
		v.open[w.name] = h
		v.lat["lock"] = append(v.lat["lock"], time.Duration(e.Took))
		if k := v.kill; k != nil && k.Key == e.Key && k.Freed == 0 && w.name != k.Worker {
			k.Freed = max(time.Unix(0, e.At).Sub(k.At), 1)
		}
	case "read", "write":
		r := v.regs[e.Key]
		if r == nil {
			r = &vregister{}
			v.regs[e.Key] = r
		}
		h := v.open[w.name]
		if e.T == "read" && v.killWanted && h != nil && v.kill == nil {
			v.killNow(w, h)
			return
		}
		ok := e.Fence >= r.maxFence
		if !ok {
			r.refused++
			if h != nil {
				h.Refused = true
			}
		} else {
			r.maxFence = e.Fence
			if e.T == "write" {
				if e.Read != r.value {
					r.lost++
				}
				r.value = e.Value
				r.accepted++
				if h != nil {
					h.Wrote = true
				}
			}
		}
		_ = w.enc.Encode(reply{OK: ok, Value: r.value})
	case "released":
		if h := v.open[w.name]; h != nil {
			h.To = e.At
			delete(v.open, w.name)
		}
	case "claim-start":
		c := &vclaim{worker: w.name, key: e.Key, proposal: e.Answer, call: e.At}
		v.claims = append(v.claims, c)
		v.claiming[w.name] = c
	case "claim-end":
		if c := v.claiming[w.name]; c != nil {
			c.done, c.ret, c.answer, c.replay, c.err = true, e.Ret, e.Answer, e.Replay, e.Err
			delete(v.claiming, w.name)
			switch {
			case e.Err != "":
			case e.Replay:
				v.lat["replay"] = append(v.lat["replay"], time.Duration(e.Took))
			default:
				v.lat["new"] = append(v.lat["new"], time.Duration(e.Took))
			}
		}
		if e.Err != "" && e.Err != "in flight" {
			v.errorf("%s: claim %s: %s", w.name, e.Key, e.Err)
		}
	case "error":
		v.errorf("%s: %s %s", w.name, e.Key, e.Err)
	}
}

// killHolder has the next worker to ask the register for a read killed
// (SIGKILL) instead of answered — it holds its key then, for sure — and
// waits up to wait for that to happen.
func (v *verifyRun) killHolder(wait time.Duration) {
	v.mu.Lock()
	v.killWanted = true
	v.mu.Unlock()
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		v.mu.Lock()
		k := v.kill
		v.mu.Unlock()
		if k != nil {
			return
		}
	}
	v.mu.Lock()
	v.killWanted = false
	v.mu.Unlock()
}

// killNow kills worker w, which holds h (v.mu held).
func (v *verifyRun) killNow(w *vworker, h *vhold) {
	_ = w.cmd.Process.Kill()
	w.dead = true
	v.killWanted = false
	v.kill = &killed{Worker: w.name, Key: h.Key, At: time.Now()}
	h.Killed = true
	h.To = h.Deadline // its lease ends by then at the latest
	delete(v.open, w.name)
}

// stopAll closes every worker's input (it finishes its hold and exits)
// and waits for them, killing those that do not end in time.
func (v *verifyRun) stopAll() {
	v.mu.Lock()
	ws := make([]*vworker, 0, len(v.workers))
	for _, w := range v.workers {
		ws = append(ws, w)
	}
	v.mu.Unlock()
	for _, w := range ws {
		_ = w.in.Close()
	}
	for _, w := range ws {
		select {
		case <-w.done:
		case <-time.After(4*v.cfg.TTL + 15*time.Second):
			_ = w.cmd.Process.Signal(syscall.SIGKILL)
			<-w.done
		}
		_ = w.cmd.Wait()
	}
}

// cleanup deletes the run's records and frees a key its killed worker may
// still hold: nothing of the run stays in the store.
func (v *verifyRun) cleanup(st *opened) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v.mu.Lock()
	keys := map[string]bool{}
	for _, c := range v.claims {
		keys[c.key] = true
	}
	locks := map[string]bool{}
	for _, h := range v.holds {
		locks[h.Key] = true
	}
	v.mu.Unlock()
	for k := range keys { // Guard.Do keeps a record under the key it is given
		_, _ = st.DeleteRecord(ctx, v.cfg.Prefix+k)
	}
	for k := range locks {
		_, _ = st.ForceRelease(ctx, v.cfg.Prefix+k)
	}
}

// verifyReport is what verify found.
type verifyReport struct {
	Store    string        `json:"store"`
	Pass     bool          `json:"pass"`
	Failures []string      `json:"failures,omitempty"`
	Duration time.Duration `json:"duration"`
	Workers  int           `json:"workers"`
	Keys     int           `json:"keys"`
	TTL      time.Duration `json:"ttl"`

	Holds         int `json:"holds"`
	WritesOK      int `json:"writes_accepted"`
	Refused       int `json:"refused_by_fence"`
	Overlaps      int `json:"overlaps"`        // holds at once with both writes accepted: must be 0
	FencedOverlap int `json:"fenced_overlaps"` // holds at once, the stale one refused by fence
	FenceBack     int `json:"fence_regressions"`
	LostUpdates   int `json:"lost_updates"`

	Claims       int    `json:"claims"`
	New          int    `json:"new"`
	Replays      int    `json:"replays"`
	InFlight     int    `json:"in_flight"`
	ClaimErrors  int    `json:"claim_errors"`
	WrongReplays int    `json:"wrong_replays"` // must be 0
	Linearizable string `json:"linearizable"`  // ok, illegal, unknown (the checker's time ran out)

	Killed *killed `json:"killed,omitempty"`

	OpsPerSec float64             `json:"ops_per_sec"`
	Latency   map[string]latStats `json:"latency"`
	Errors    []string            `json:"errors,omitempty"`
	ErrorsN   int                 `json:"errors_total"`
}

type latStats struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50"`
	P99 time.Duration `json:"p99"`
	Max time.Duration `json:"max"`
}

func stats(ds []time.Duration) latStats {
	if len(ds) == 0 {
		return latStats{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return latStats{N: len(s), P50: s[len(s)/2], P99: s[min(len(s)-1, len(s)*99/100)], Max: s[len(s)-1]}
}

// judge checks the history (v.mu held).
func (v *verifyRun) judge(d time.Duration, n int) *verifyReport {
	r := &verifyReport{Duration: d, Workers: n, Keys: v.cfg.Keys, TTL: v.cfg.TTL, Latency: map[string]latStats{},
		Errors: v.errs, ErrorsN: v.nerrs}
	r.Killed = v.kill
	for _, h := range v.open { // stopped mid-hold: it let go at the end
		h.To = v.ended.UnixNano()
	}
	for _, reg := range v.regs {
		r.WritesOK += reg.accepted
		r.Refused += reg.refused
		r.LostUpdates += reg.lost
	}
	r.Holds = len(v.holds)
	var overlaps []string
	r.Overlaps, r.FencedOverlap, r.FenceBack, overlaps = judgeHolds(v.holds)
	r.Claims = len(v.claims)
	first := map[string]string{} // by key: the answer the first finished claim got
	for _, c := range v.claims {
		switch {
		case !c.done:
		case c.err == "in flight":
			r.InFlight++
		case c.err != "":
			r.ClaimErrors++
		case c.replay:
			r.Replays++
		default:
			r.New++
		}
	}
	byRet := slices.Clone(v.claims)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].ret < byRet[j].ret })
	for _, c := range byRet {
		if !c.done || c.err != "" {
			continue
		}
		if a, ok := first[c.key]; !ok {
			first[c.key] = c.answer
		} else if a != c.answer {
			r.WrongReplays++
		}
	}
	r.Linearizable = checkClaims(v.claims, v.ended.UnixNano())
	for k, ds := range v.lat {
		r.Latency[k] = stats(ds)
	}
	if el := v.ended.Sub(v.started).Seconds(); el > 0 {
		r.OpsPerSec = float64(len(v.holds)+len(v.claims)) / el
	}
	fail := func(format string, args ...any) { r.Failures = append(r.Failures, fmt.Sprintf(format, args...)) }
	if r.Overlaps > 0 {
		fail("%d time(s) two workers held a key at once and both writes were accepted (%s)", r.Overlaps, strings.Join(overlaps, "; "))
	}
	if r.FenceBack > 0 {
		fail("%d lease(s) got a fence not above an earlier lease's of the same key", r.FenceBack)
	}
	if r.LostUpdates > 0 {
		fail("%d accepted write(s) were based on a value that was no longer current", r.LostUpdates)
	}
	if r.WrongReplays > 0 {
		fail("%d claim(s) got another answer than the key's first", r.WrongReplays)
	}
	if r.Linearizable == "illegal" {
		fail("the claims' history is not linearizable: some answer is explained by no order of the calls")
	}
	if r.Holds == 0 || r.New == 0 {
		fail("too little happened to judge: %d holds, %d new claims (%d errors)", r.Holds, r.New, r.ErrorsN)
	}
	switch {
	case v.kill == nil:
		fail("no worker held a key to be killed within %v", d/3)
	case v.kill.Freed == 0:
		fail("the killed worker's key %s was not held again within the run (TTL %v)", v.kill.Key, v.cfg.TTL)
	}
	r.Pass = len(r.Failures) == 0
	return r
}

// judgeHolds counts, per key, the pairs of holds at once with both writes
// accepted and those where fencing refused one, and the leases whose fence
// is not above that of every lease of the key that ended before they
// began.
func judgeHolds(holds []*vhold) (overlaps, fenced, back int, examples []string) {
	byKey := map[string][]*vhold{}
	for _, h := range holds {
		byKey[h.Key] = append(byKey[h.Key], h)
	}
	for _, hs := range byKey {
		byFrom := slices.Clone(hs)
		sort.Slice(byFrom, func(i, j int) bool { return byFrom[i].From < byFrom[j].From })
		byTo := slices.Clone(hs)
		sort.Slice(byTo, func(i, j int) bool { return byTo[i].To < byTo[j].To })
		var ended uint64 // the highest fence of the holds ended so far
		j := 0
		var active []*vhold
		for _, b := range byFrom {
			for ; j < len(byTo) && byTo[j].To < b.From; j++ {
				ended = max(ended, byTo[j].Fence)
			}
			if b.Fence <= ended && ended > 0 {
				back++
			}
			active = slices.DeleteFunc(active, func(a *vhold) bool { return a.To < b.From })
			for _, a := range active {
				if a.Wrote && b.Wrote {
					overlaps++
					if len(examples) < 3 {
						examples = append(examples, fmt.Sprintf("%s: %s (fence %d) held it from %s to %s, %s (fence %d) from %s",
							b.Key, a.Worker, a.Fence, stamp(a.From), stamp(a.To), b.Worker, b.Fence, stamp(b.From)))
					}
				} else {
					fenced++
				}
			}
			active = append(active, b)
		}
	}
	return overlaps, fenced, back, examples
}

// stamp is a Unix ns time as a clock time to the µs.
func stamp(ns int64) string { return time.Unix(0, ns).UTC().Format("15:04:05.000000") }

// claimIn and claimOut are a Guard.Do call in the linearizability model:
// the answer the call proposed, and the one it got (unknown: the worker
// died, or the call failed, so it may or may not have run).
type claimIn struct{ key, proposal string }
type claimOut struct {
	answer  string
	ran     bool
	unknown bool
}

// claimModel is a key's record: none, then the first run's answer, which
// every later call gets.
var claimModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		m := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(claimIn).key
			if _, ok := m[k]; !ok {
				keys = append(keys, k)
			}
			m[k] = append(m[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, m[k])
		}
		return out
	},
	Init: func() []any { return []any{""} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(string), input.(claimIn), output.(claimOut)
		switch {
		case out.unknown && s == "":
			return []any{"", in.proposal}
		case out.unknown:
			return []any{s}
		case s == "" && out.ran && out.answer == in.proposal:
			return []any{in.proposal}
		case s != "" && !out.ran && out.answer == s:
			return []any{s}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(claimIn), output.(claimOut)
		return fmt.Sprintf("Do(%s, %s) -> %s ran=%v unknown=%v", in.key, in.proposal, out.answer, out.ran, out.unknown)
	},
}

// checkClaims checks the claims' history with porcupine; calls without an
// answer end at end.
func checkClaims(claims []*vclaim, end int64) string {
	var ops []porcupine.Operation
	clients := map[string]int{}
	for _, c := range claims {
		if c.err == "in flight" {
			continue // it saw a run going, and changed nothing
		}
		id, ok := clients[c.worker]
		if !ok {
			id = len(clients)
			clients[c.worker] = id
		}
		out := claimOut{answer: c.answer, ran: !c.replay, unknown: !c.done || c.err != ""}
		ret := c.ret
		if out.unknown {
			ret = end
		}
		ops = append(ops, porcupine.Operation{ClientId: id, Input: claimIn{c.key, c.proposal}, Call: c.call, Output: out, Return: ret})
	}
	switch porcupine.CheckOperationsTimeout(claimModel.ToModel(), ops, 30*time.Second) {
	case porcupine.Ok:
		return "ok"
	case porcupine.Illegal:
		return "illegal"
	}
	return "unknown"
}

func (r *verifyReport) print(w io.Writer) {
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "%s\n\n%s: %v, %d workers, %d lock keys, TTL %v\n\n", r.Store, verdict, r.Duration, r.Workers, r.Keys, r.TTL)
	for _, f := range r.Failures {
		fmt.Fprintf(w, "FAIL %s\n", f)
	}
	if len(r.Failures) > 0 {
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  holds / writes accepted / refused by fence\t%d / %d / %d\n", r.Holds, r.WritesOK, r.Refused)
	fmt.Fprintf(tw, "  overlapping holds, both writes accepted (must be 0)\t%d\n", r.Overlaps)
	fmt.Fprintf(tw, "  overlapping holds, the stale one fenced off\t%d\n", r.FencedOverlap)
	fmt.Fprintf(tw, "  fences not above an earlier lease's (must be 0)\t%d\n", r.FenceBack)
	fmt.Fprintf(tw, "  lost updates (must be 0)\t%d\n", r.LostUpdates)
	fmt.Fprintf(tw, "  claims: new / replayed / in flight / failed\t%d / %d / %d / %d\n", r.New, r.Replays, r.InFlight, r.ClaimErrors)
	fmt.Fprintf(tw, "  replays with another answer (must be 0)\t%d\n", r.WrongReplays)
	fmt.Fprintf(tw, "  claims' history linearizable\t%s\n", r.Linearizable)
	if k := r.Killed; k != nil {
		freed := "not within the run"
		if k.Freed > 0 {
			freed = k.Freed.Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "  killed %s holding %s: key free again after\t%s (TTL %v)\n", k.Worker, k.Key, freed, r.TTL)
	}
	fmt.Fprintf(tw, "  operations/s\t%.0f\n", r.OpsPerSec)
	for _, k := range []string{"lock", "new", "replay"} {
		s := r.Latency[k]
		fmt.Fprintf(tw, "  %s: n / p50 / p99 / max\t%d / %v / %v / %v\n", map[string]string{"lock": "lock acquire", "new": "new-key claim", "replay": "replayed claim"}[k],
			s.N, s.P50.Round(time.Microsecond), s.P99.Round(time.Microsecond), s.Max.Round(time.Microsecond))
	}
	fmt.Fprintf(tw, "  errors\t%d\n", r.ErrorsN)
	tw.Flush()
	for _, e := range r.Errors {
		fmt.Fprintf(w, "  error: %s\n", e)
	}
}
