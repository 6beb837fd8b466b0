package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

const usage = `oncectl inspects and repairs oncekit locks and idempotency records.

Usage:
  oncectl [flags] ping
  oncectl [flags] doctor
  oncectl [flags] verify [--for D] [--workers N] [--keys N] [--ttl D] [--html FILE]
  oncectl version
  oncectl [flags] lock inspect KEY
  oncectl [flags] lock release KEY --force [--yes]
  oncectl [flags] record list [--in-flight] [--limit N]
  oncectl [flags] record get KEY [KEY FLAGS]
  oncectl [flags] record delete KEY [KEY FLAGS] [--yes]

Flags (anywhere on the line):
  --store URL      the store (default $ONCEKIT_STORE)
  --json           print JSON instead of a table
  --timeout D      how long to wait for the store (default 5s)
  --force          required by lock release
  --yes            do not ask for confirmation
  --in-flight      record list: only the claims in flight (runs going, or stuck)
  --limit N        record list: at most N records (default 100)
  --for D          verify: how long to run (default 30s)
  --workers N      verify: worker processes (default 4, at least 2)
  --keys N         verify: lock keys the workers share (default 2)
  --ttl D          doctor: your TTL, to weigh timings against (default 10s,
                   lock.DefaultTTL); verify: the TTL of its locks and claims
                   (default 2s)
  --html FILE      verify: also write the report as a page with pictures

Key flags (how the middleware stored KEY, the key the client sent):
  --scope S        httpmw (and Guard users): idemdriver.ScopedKey(S, KEY), S the
                   scope function's answer ("" for Unscoped)
  --grpc-method M  grpcmw: the call's full method ("/pkg.Service/Method"),
                   with --scope for the scope
  --kafka-group G --kafka-topic T
                   kafkamw's default scope: the consumer group and topic,
                   KEY the message-id
  --place P        the record was placed (WithPlacement) in P
  --stored         KEY is the stored record key itself ("idem:..."), as is
  --               every argument after this is positional (a KEY starting with -)

doctor reads the settings each promise rests on (eviction, persistence,
replicas, failover, rights, commit durability, a pooler, sessions, the
clock) and says for each whether it holds on this deployment, on what
condition, and what to change, on every store but memory://.

verify is an acceptance test of the store, bounded by --for: worker
processes of oncectl's own take the locks on a few keys and write a fenced
register under each lease, claim new and duplicate keys with Guard.Do, and
one is killed (SIGKILL) while it holds a key. It reports overlapping holds
whose writes were both accepted (must be 0), fences that do not grow, replays
with another answer, whether the claims' history is linearizable, how long
the killed worker's key took to free, and the latencies. It writes only
under oncectl-verify/<run>/ and deletes what it wrote.

Exit status: 0 done, 1 the operation failed or was declined (doctor: a
promise does not hold; verify: a check failed), 2 bad usage (doctor: the store could not be
reached or has no checks).

`

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func main() {
	quietRedisLog() // go-redis's own log lines (Sentinel's choices, failed dials) are not oncectl's output
	if cfg := os.Getenv(verifyWorkerEnv); cfg != "" {
		os.Exit(runVerifyWorker(cfg, os.Stdin, os.Stdout))
	}
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

type cli struct {
	storeURL string
	json     bool
	timeout  time.Duration
	force    bool
	yes      bool
	scope    string
	stored   bool
	method   string
	group    string
	topic    string
	place    string
	inFlight bool
	limit    int

	verifyFor time.Duration
	workers   int
	keys      int
	ttl       time.Duration
	html      string

	in       *bufio.Reader
	out, err io.Writer
}

// run is oncectl with its arguments and streams; it returns the exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{in: bufio.NewReader(stdin), out: stdout, err: stderr}
	fs := flag.NewFlagSet("oncectl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.storeURL, "store", os.Getenv("ONCEKIT_STORE"), "")
	fs.BoolVar(&c.json, "json", false, "")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "")
	fs.BoolVar(&c.force, "force", false, "")
	fs.BoolVar(&c.yes, "yes", false, "")
	fs.StringVar(&c.scope, "scope", "", "")
	fs.BoolVar(&c.stored, "stored", false, "")
	fs.StringVar(&c.method, "grpc-method", "", "")
	fs.StringVar(&c.group, "kafka-group", "", "")
	fs.StringVar(&c.topic, "kafka-topic", "", "")
	fs.StringVar(&c.place, "place", "", "")
	fs.BoolVar(&c.inFlight, "in-flight", false, "")
	fs.IntVar(&c.limit, "limit", 100, "")
	fs.DurationVar(&c.verifyFor, "for", 30*time.Second, "")
	fs.IntVar(&c.workers, "workers", 4, "")
	fs.IntVar(&c.keys, "keys", 2, "")
	fs.DurationVar(&c.ttl, "ttl", 0, "")
	fs.StringVar(&c.html, "html", "", "")

	pos, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage, storeHelp, "\n")
		return exitOK
	}
	if err != nil {
		return c.usageErr(err.Error())
	}
	if c.timeout <= 0 {
		return c.usageErr("--timeout must be positive")
	}
	if len(pos) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	if pos[0] == "version" {
		if len(pos) != 1 {
			return c.usageErr("version takes no argument")
		}
		fmt.Fprintln(stdout, version())
		return exitOK
	}
	if pos[0] == "ping" {
		if len(pos) != 1 {
			return c.usageErr("ping takes no argument")
		}
		return c.ping()
	}
	if pos[0] == "doctor" {
		if len(pos) != 1 {
			return c.usageErr("doctor takes no argument (the store is --store)")
		}
		return c.doctor()
	}
	if pos[0] == "verify" {
		if len(pos) != 1 {
			return c.usageErr("verify takes no argument (the store is --store)")
		}
		return c.verify()
	}
	if len(pos) == 2 && pos[0] == "record" && pos[1] == "list" {
		if c.limit < 1 {
			return c.usageErr("--limit must be at least 1")
		}
		return c.listRecords()
	}
	if len(pos) != 3 {
		return c.usageErr(fmt.Sprintf("%q: want a command, a subcommand and one KEY", strings.Join(pos, " ")))
	}
	cmd, key := pos[0]+" "+pos[1], pos[2]
	switch cmd {
	case "lock inspect", "lock release", "record get", "record delete":
	default:
		return c.usageErr(fmt.Sprintf("unknown command %q", cmd))
	}
	if pos[0] == "record" {
		if key, err = c.recordKey(key); err != nil {
			return c.usageErr(err.Error())
		}
	}
	if err := lockdriver.ValidateKey(key); err != nil {
		return c.usageErr(fmt.Sprintf("KEY: %v", err))
	}
	if cmd == "lock release" && !c.force {
		return c.usageErr("lock release frees a key that someone holds; it needs --force")
	}

	return c.withStore(func(ctx context.Context, st *opened) int { return c.do(ctx, st, cmd, key) })
}

// do runs a lock or record command on key.
func (c *cli) do(ctx context.Context, st *opened, cmd, key string) int {
	switch cmd {
	case "lock inspect":
		info, err := st.InspectLock(ctx, key)
		if err != nil {
			return c.fail(err)
		}
		return c.printLock(info)
	case "lock release":
		return c.release(ctx, st, key)
	case "record get":
		info, err := st.InspectRecord(ctx, key)
		if err != nil {
			return c.fail(err)
		}
		return c.printRecord(info)
	default:
		return c.deleteRecord(ctx, st, key)
	}
}

// recordKey returns the stored key of the record of key, as the key flags
// say the middleware derived it.
func (c *cli) recordKey(key string) (string, error) {
	kafka := c.group != "" || c.topic != ""
	switch {
	case c.stored && (c.scope != "" || c.method != "" || kafka || c.place != ""):
		return "", errors.New("--stored excludes the other key flags (--scope, --grpc-method, --kafka-group/--kafka-topic, --place)")
	case c.stored:
		return key, nil
	case kafka && (c.group == "" || c.topic == ""):
		return "", errors.New("--kafka-group and --kafka-topic go together")
	case kafka && (c.scope != "" || c.method != ""):
		return "", errors.New("--kafka-group/--kafka-topic exclude --scope and --grpc-method")
	}
	scope, method := c.scope, c.method
	if kafka {
		scope = idemdriver.KafkaScope(c.group, c.topic)
	}
	k, err := idemdriver.StoredKey(scope, method, key, c.place)
	return k.String(), err
}

// version is oncekit's version (oncekit.Version), the module's version as
// the build recorded it ("(devel)" for a build from a checkout) and the Go
// version.
func version() string {
	v := "(unknown)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
	}
	return "oncekit oncectl " + oncekit.Version + " (module " + v + ") " + runtime.Version()
}

// parse reads flags anywhere on the line and returns the positional
// arguments; everything after "--" is positional.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, rest = args[:i], args[i+1:]
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos, args = append(pos, args[0]), args[1:]
	}
	return append(pos, rest...), nil
}

// ping checks that the store can serve: exit 0 and "ok", or 1 and why.
func (c *cli) ping() int {
	return c.withStore(func(ctx context.Context, st *opened) int { return c.pingStore(ctx, st) })
}

// withStore opens the store and runs f with it and a context bounded by
// --timeout; a store that cannot be opened fails.
func (c *cli) withStore(f func(ctx context.Context, st *opened) int) int {
	st, err := openStore(c.storeURL, c.timeout)
	if err != nil {
		return c.fail(err)
	}
	defer st.close()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	return f(ctx, st)
}

func (c *cli) pingStore(ctx context.Context, st *opened) int {
	start := time.Now()
	if err := st.Ping(ctx); err != nil {
		return c.fail(err)
	}
	if c.json {
		fmt.Fprintf(c.out, "{\"ok\":true,\"ms\":%.3f}\n", float64(time.Since(start).Microseconds())/1000)
	} else {
		fmt.Fprintf(c.out, "ok (%s)\n", time.Since(start).Round(time.Microsecond))
	}
	return exitOK
}

func (c *cli) usageErr(msg string) int {
	fmt.Fprintf(c.err, "oncectl: %s\nRun 'oncectl --help' for usage.\n", msg)
	return exitUsage
}

func (c *cli) fail(err error) int {
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w (no answer within --timeout %v: is the store up and reachable?)", err, c.timeout)
	}
	fmt.Fprintf(c.err, "oncectl: %v\n", err)
	return exitFail
}

// confirm asks question on stderr and reads the answer; only y or yes
// agrees. --yes answers for the user.
func (c *cli) confirm(question string) bool {
	if c.yes {
		return true
	}
	fmt.Fprintf(c.err, "%s [y/N] ", question)
	line, err := c.in.ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintln(c.err)
		return false
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}

func (c *cli) release(ctx context.Context, st store, key string) int {
	info, err := st.InspectLock(ctx, key)
	if err != nil {
		return c.fail(err)
	}
	if !info.Held {
		fmt.Fprintf(c.err, "oncectl: %s is not held; nothing to release\n", printable(key))
		return c.printLock(info)
	}
	if !c.confirm(fmt.Sprintf("Release %s, held by token %s with fence %d and %s left? The holder keeps running until its next refresh.",
		printable(key), info.Token, info.Fence, ttl(info.TTL))) {
		return c.fail(errors.New("not released"))
	}
	released, err := st.ForceRelease(ctx, key)
	if err != nil {
		return c.fail(err)
	}
	if !released.Held {
		fmt.Fprintf(c.err, "oncectl: %s was released before oncectl got to it\n", printable(key))
	}
	return c.printLock(released)
}

func (c *cli) deleteRecord(ctx context.Context, st store, key string) int {
	info, err := st.InspectRecord(ctx, key)
	if err != nil {
		return c.fail(err)
	}
	if !info.Found {
		fmt.Fprintf(c.err, "oncectl: no record for %s\n", key)
		return c.printRecord(info)
	}
	what := "the completed record"
	if info.State == idemdriver.InFlight {
		what = "the in-flight claim (its run loses it and cannot store a result)"
	}
	if info.Corrupt != "" {
		what = "the corrupt record"
	}
	if !c.confirm(fmt.Sprintf("Delete %s of %s? The next request with this key runs again.", what, key)) {
		return c.fail(errors.New("not deleted"))
	}
	deleted, err := st.DeleteRecord(ctx, key)
	if err != nil {
		return c.fail(err)
	}
	if !deleted {
		fmt.Fprintf(c.err, "oncectl: the record of %s was gone before oncectl got to it\n", key)
	}
	if c.json {
		return c.printJSON(map[string]any{"key": key, "deleted": deleted})
	}
	fmt.Fprintf(c.out, "deleted %s\n", key)
	return exitOK
}

type lockJSON struct {
	Key     string  `json:"key"`
	Held    bool    `json:"held"`
	Token   string  `json:"token,omitempty"`
	Owner   string  `json:"owner,omitempty"`
	Holds   int     `json:"holds,omitempty"`
	Fence   uint64  `json:"fence"`
	TTLms   float64 `json:"ttl_ms,omitempty"`
	Waiters int     `json:"waiters"`
	Detail  string  `json:"detail,omitempty"`
}

func (c *cli) printLock(info lockdriver.LockInfo) int {
	if c.json {
		j := lockJSON{Key: info.Key, Held: info.Held, Token: info.Token, Owner: info.Owner, Holds: info.Holds,
			Fence: info.Fence, Waiters: info.Waiters, Detail: info.Detail}
		if info.Held {
			j.TTLms = float64(info.TTL.Microseconds()) / 1000
		}
		return c.printJSON(j)
	}
	rows := [][2]string{{"key", printable(info.Key)}, {"held", yesNo(info.Held)}}
	if info.Held {
		rows = append(rows, [2]string{"token", info.Token}, [2]string{"fence", strconv.FormatUint(info.Fence, 10)},
			[2]string{"ttl", ttl(info.TTL)})
		if info.Owner != "" {
			rows = append(rows, [2]string{"owner", printable(info.Owner)}, [2]string{"holds", strconv.Itoa(info.Holds)})
		}
	} else if info.Fence != 0 {
		rows = append(rows, [2]string{"last fence", strconv.FormatUint(info.Fence, 10)})
	}
	waiters := strconv.Itoa(info.Waiters)
	if info.Waiters < 0 {
		waiters = "unknown"
	}
	rows = append(rows, [2]string{"waiters", waiters})
	if info.Detail != "" {
		rows = append(rows, [2]string{"detail", info.Detail})
	}
	return c.printTable(rows)
}

type recordJSON struct {
	Key         string `json:"key"`
	Found       bool   `json:"found"`
	State       string `json:"state,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	Token       string `json:"token,omitempty"`
	Fence       uint64 `json:"fence,omitempty"`
	Expires     string `json:"expires,omitempty"`
	ResultBytes int    `json:"result_bytes,omitempty"`
	Result      string `json:"result,omitempty"`
	FinalError  string `json:"final_error,omitempty"`
	Corrupt     string `json:"corrupt,omitempty"`
	Detail      string `json:"detail,omitempty"`
}

// toJSON is info as printed.
func toJSON(info idemdriver.RecordInfo) recordJSON {
	j := recordJSON{Key: info.Key, Found: info.Found, Fingerprint: info.Fingerprint, Token: info.Token,
		Fence: info.Fence, Corrupt: info.Corrupt, Detail: info.Detail}
	if info.Found && info.Corrupt == "" {
		j.State = strings.ReplaceAll(info.State.String(), " ", "_")
	}
	if !info.Expires.IsZero() {
		j.Expires = info.Expires.UTC().Format(time.RFC3339Nano)
	}
	if info.State == idemdriver.Completed && info.Corrupt == "" {
		res, final, err := idem.RecordOutcome(info)
		switch {
		case err != nil:
			j.Corrupt = err.Error()
		case final != nil:
			j.FinalError = final.Error()
		default:
			j.ResultBytes, j.Result = len(res), preview(res)
		}
	}
	return j
}

// listRecords prints up to --limit records (with --in-flight: only the
// claims in flight, the runs still going or stuck).
func (c *cli) listRecords() int {
	return c.withStore(c.listStore)
}

func (c *cli) listStore(ctx context.Context, st *opened) int {
	l, ok := st.store.(idemdriver.Lister)
	if !ok {
		return c.fail(fmt.Errorf("%T cannot list its records", st.store))
	}
	var out []recordJSON
	var inspectErr error
	err := l.ListKeys(ctx, func(key string) bool {
		info, err := st.InspectRecord(ctx, key)
		if err != nil {
			inspectErr = err
			return false
		}
		if !info.Found || (c.inFlight && (info.State != idemdriver.InFlight || info.Corrupt != "")) {
			return true
		}
		out = append(out, toJSON(info))
		return len(out) < c.limit
	})
	if err = errors.Join(err, inspectErr); err != nil {
		return c.fail(err)
	}
	if c.json {
		if out == nil {
			out = []recordJSON{}
		}
		return c.printJSON(out)
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tFENCE\tEXPIRES IN")
	for _, j := range out {
		state, in := strings.ReplaceAll(j.State, "_", " "), ""
		if j.Corrupt != "" {
			state = "corrupt"
		}
		if t, err := time.Parse(time.RFC3339Nano, j.Expires); err == nil {
			in = ttl(time.Until(t))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", printable(j.Key), state, j.Fence, in)
	}
	_ = tw.Flush()
	if len(out) == c.limit {
		fmt.Fprintf(c.err, "the first %d records; --limit N for more\n", c.limit)
	}
	return exitOK
}

func (c *cli) printRecord(info idemdriver.RecordInfo) int {
	j := toJSON(info)
	if c.json {
		return c.printJSON(j)
	}
	rows := [][2]string{{"key", j.Key}, {"found", yesNo(j.Found)}}
	add := func(name, v string) {
		if v != "" {
			rows = append(rows, [2]string{name, v})
		}
	}
	add("state", strings.ReplaceAll(j.State, "_", " "))
	add("fingerprint", j.Fingerprint)
	add("token", j.Token)
	if j.Fence != 0 {
		add("fence", strconv.FormatUint(j.Fence, 10))
	}
	if !info.Expires.IsZero() {
		add("expires", fmt.Sprintf("%s (in %s)", j.Expires, ttl(time.Until(info.Expires))))
	}
	if info.State == idemdriver.Completed && j.FinalError == "" && j.Corrupt == "" {
		add("result", fmt.Sprintf("%d bytes: %s", j.ResultBytes, j.Result))
	}
	add("final error", j.FinalError)
	add("corrupt", j.Corrupt)
	add("detail", j.Detail)
	return c.printTable(rows)
}

func (c *cli) printTable(rows [][2]string) int {
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	if err := tw.Flush(); err != nil {
		return c.fail(err)
	}
	return exitOK
}

func (c *cli) printJSON(v any) int {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return c.fail(err)
	}
	return exitOK
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func ttl(d time.Duration) string {
	switch {
	case d < 0:
		return "no expiry"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(10 * time.Millisecond).String()
}

// preview shows up to 200 bytes of a result: as text when it is printable
// UTF-8, else as hex.
func preview(b []byte) string {
	const limit = 200
	more := ""
	if len(b) > limit {
		b, more = b[:limit], "…"
	}
	if utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool { return r < 0x20 && r != '\n' && r != '\t' }) {
		return strconv.Quote(string(b)) + more
	}
	return fmt.Sprintf("%x%s", b, more)
}

// printable quotes a key that would garble a terminal.
func printable(s string) string {
	if strconv.CanBackquote(s) && !strings.ContainsAny(s, " \t") {
		return s
	}
	return strconv.Quote(s)
}
