package rediskit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/bg"
	"github.com/oncekit/oncekit/storage/internal/redisnotify"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// Base is what one redisstore or redlockstore Store shares with the other
// driver: its options, the names of its keys, its identity in the keys'
// waiting queues, its background requests, and the calls of every script
// with their arguments in one place. A Base must not be copied after
// Init.
type Base struct {
	Options
	Keys    Keys
	Records Records
	// Member is this Store's name in the keys' waiting queues: random, one
	// per Store.
	Member string
	// BG tracks requests that callers stopped waiting for, and their
	// clean-up; Close waits for it.
	BG bg.Group

	// ClockSkew shifts this client's clock, for tests that play a client
	// whose clock is off from the servers'. Zero in production.
	ClockSkew time.Duration

	// Grants makes a release hand the key to the first waiting process
	// that asked for it (see release.lua) rather than only wake it. Set by
	// a driver whose release alone decides who holds the key (one Redis
	// deployment; not Redlock, where a majority of nodes must agree).
	Grants bool

	// StrictLeases makes Complete, Abandon and Extend refuse a claim whose
	// lease ran out even when no Begin took it over (one more call in
	// the script). Set by Redlock: a stale holder's completion must not
	// land on a node the new claim has not reached yet, where it would
	// be the completed record every later Begin finds. On one deployment
	// a claim nobody took over is still the only one: it may finish.
	StrictLeases bool

	// Replication, when it asks for replicas, follows every write that
	// grants, keeps or completes a lease or a claim with a WAIT in the
	// same round trip (see replicas.go).
	Replication Replication

	clocks clocks // each server's clock offset (ServerDeadline)
	args   scriptArgs
}

// HoldFences is how many fences one take of a lock key reserves at most
// (lua/fence.lua's hold_fences): a hold's leases take its fences in turn,
// the first from the take and the others from local hand-offs, which need
// no round trip. A hold in Redis serves as many leases as it has fences.
const HoldFences = 128

// InspectLock is InspectLock on b's keys: the fence is the last of the
// latest hold's fences.
func (b *Base) InspectLock(ctx context.Context, c redis.Scripter, key string) (LockState, error) {
	return InspectLock(ctx, c, b.Keys, key)
}

// Init sets b up with o, which the driver has validated.
func (b *Base) Init(o Options) {
	b.Options = o
	b.Keys = Keys{Prefix: o.Prefix}
	b.Records = Records{Prefix: o.RecordPrefix}
	b.Member = token.New()
	b.args = scriptArgs{
		placeLife: b.placeLife(), wakeGrace: b.wakeGrace(),
		mode: b.mode(false), quiet: b.mode(true),
	}
}

// scriptArgs are the scripts' arguments that are the same on every call,
// converted to interface values once (each conversion of a call's
// arguments is an allocation on the path of every request).
type scriptArgs struct {
	placeLife, wakeGrace, mode, quiet any
}

// argEmpty is "" as a script argument.
var argEmpty any = ""

// mode is the pub/sub mode argument of the scripts that announce.
func (b *Base) mode(quiet bool) string {
	if quiet {
		return redisnotify.Off.ScriptArg()
	}
	return b.PubSub.ScriptArg()
}

// wakeGrace is how long a waiting process a release wakes keeps its place
// in the key's queue without trying again (it tries at once), in
// milliseconds: a process that died while queued is woken once, then
// skipped.
func (b *Base) wakeGrace() int64 { return (4 * b.MaxBackoff).Milliseconds() }

// placeLife is how long a queue member's place lasts without a new
// attempt, in milliseconds: longer than the recheck interval, after which
// a live waiter always tries again.
func (b *Base) placeLife() int64 { return (3 * b.Recheck).Milliseconds() }

// OwnChannel is where releases of key are announced to this Store when it
// is first in the key's waiting queue.
func (b *Base) OwnChannel(key string) string { return b.Keys.MemberChannel(key, b.Member) }

// NextWait is how long a waiter sleeps before it tries again when nothing
// wakes it: the recheck interval, or the holder's remaining TTL (pttl)
// when that is sooner, or a jittered backoff (which it doubles) when no
// release message can be relied on: the waiter is not subscribed, or the
// holder's key has no expiry (pttl < 0).
func (b *Base) NextWait(subscribed bool, pttl time.Duration, backoff *time.Duration) time.Duration {
	wait := b.Recheck
	switch {
	case !subscribed || pttl < 0:
		wait = min(wait, *backoff/2+rand.N(*backoff/2+1))
		*backoff = min(2**backoff, b.MaxBackoff)
	case pttl < wait:
		wait = pttl + time.Millisecond
	}
	return wait
}

// RunScript runs one of the scripts that are not a lock's or a record's
// (Stock) as the Store runs its own: tracked by b.BG, followed by WAIT
// when the Store asks for replicas' acknowledgement.
func (b *Base) RunScript(ctx context.Context, c redis.Scripter, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	return b.run(ctx, c, s, keys, nil, args...)
}

// run is Run tracked by b.BG.
func (b *Base) run(ctx context.Context, c redis.Scripter, s *redis.Script, keys []string, late func(*redis.Cmd), args ...any) *redis.Cmd {
	if b.acked(s) {
		return b.runAcked(ctx, c, s, keys, late, args...)
	}
	cmd := Run(ctx, &b.BG, c, s, keys, late, args...)
	if cc := clusterOf(c); cc != nil && isRefused(cmd.Err()) {
		// The node that served the slot is down: its replica is taking
		// over, and go-redis would keep dialling the dead node until its
		// own periodic reload. Look at the cluster again now, so that the
		// caller's retry goes to the new primary.
		cc.ReloadState(context.WithoutCancel(ctx))
	}
	return cmd
}

// isRefused reports a connection the server refused: it is down.
func isRefused(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection refused")
}

// AcquireArgs is one run of the acquire script.
type AcquireArgs struct {
	Key      string
	Token    string
	TTL      time.Duration
	Deadline time.Time // the caller's: the script refuses to take the key after it; zero for none
	Unfenced bool      // skip the fence counter (Redlock's unfenced mode)
	Owner    string    // lock.WithOwner, or ""
	// Queued makes the caller (b.Member) join the key's waiting queue when
	// the key is held, at Place (µs; 0: the server's clock decides).
	Queued bool
	Place  int64
	// Grantable, with Queued, records Token and TTL with the place, so that
	// a release may grant the key to it (Base.Grants; not with an Owner).
	Grantable bool
}

// Acquire runs the acquire script. When ctx ends first, it returns ctx's
// error at once and late (if set) receives the reply when it comes, to undo
// what it took.
func (b *Base) Acquire(ctx context.Context, c redis.Scripter, a AcquireArgs, late func(AcquireReply)) (AcquireReply, error) {
	// The queue is passed on every attempt: a caller outside it must not
	// take a key reserved for the waiter a release just woke.
	lock := b.Keys.Lock(a.Key) // every other name of the key is the lock's with a suffix
	deadline := b.ServerDeadline(c, a.Deadline)
	fenced := 1
	if a.Unfenced {
		fenced = 0
	}
	var onLate func(*redis.Cmd)
	if late != nil {
		onLate = func(cmd *redis.Cmd) {
			if r, err := ParseAcquire(valueOf(cmd)); err == nil {
				late(r)
			}
		}
	}
	if a.Owner == "" && !a.Queued {
		// A first attempt: one key and four arguments decide it
		// (lua/acquire_new.lua) unless a process is queued for the key.
		cmd := b.run(ctx, c, AcquireNew, []string{lock}, onLate, a.Token, a.TTL.Milliseconds(), deadline, fenced)
		if !undecided(cmd) {
			r, err := ParseAcquire(cmd)
			r.Plain = err == nil && r.Code == AcquireTaken
			return r, err
		}
	}
	q := lock + ":q"
	keys := []string{lock, lock + ":owner", q, q + "x"}
	member, owner := argEmpty, argEmpty
	if a.Queued {
		member = b.Member
	}
	if a.Owner != "" {
		owner = a.Owner
	}
	grantable := "0"
	if a.Grantable {
		grantable = "1"
	}
	args := []any{a.Token, a.TTL.Milliseconds(), deadline, fenced, owner, member, b.args.placeLife, a.Place, b.args.wakeGrace, grantable}
	return ParseAcquire(b.run(ctx, c, Acquire, keys, onLate, args...))
}

// SetNXer is a client that runs SET NX without a script: every go-redis
// client.
type SetNXer interface {
	SetNX(ctx context.Context, key string, value any, expiration time.Duration) *redis.BoolCmd
}

// Getter is a client that runs GET without a script: every go-redis
// client.
type Getter interface {
	Get(ctx context.Context, key string) *redis.StringCmd
}

// LookCompleted reads key's record with one plain GET — no script, the
// cheapest look a server can answer — and returns its result when the
// record is completed with fingerprint (ok). Anything else (no record, a
// claim in flight, another fingerprint, a tombstone, not a record) is not
// ok, for the begin script to decide.
func (b *Base) LookCompleted(ctx context.Context, c Getter, key idemdriver.Key, fingerprint string) ([]byte, bool, error) {
	enforces := false
	if s, ok := c.(redis.Scripter); ok {
		enforces = EnforcesDeadlines(s)
	}
	cmd := runCmd(ctx, &b.BG, enforces, redis.NewStringCmd, func(ctx context.Context) *redis.StringCmd {
		return c.Get(ctx, b.Records.Record(key))
	}, nil)
	v, err := cmd.Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	res, ok := completedResult(v, fingerprint)
	return res, ok, nil
}

// completedResult is the result of a completed record v
// ("R2|c|<fence>|<flags>||<fingerprint length>|<fingerprint><result>", see
// lua/claim.lua) when its fingerprint is fingerprint.
func completedResult(v []byte, fingerprint string) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(v, []byte("R2|c|"))
	if !ok {
		return nil, false
	}
	fence, rest, ok := bytes.Cut(rest, []byte("|"))
	if !ok || len(fence) == 0 || bytes.ContainsFunc(fence, func(r rune) bool { return r < '0' || r > '9' }) {
		return nil, false
	}
	if _, rest, ok = bytes.Cut(rest, []byte("|")); !ok { // the flags
		return nil, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte("|")); !ok { // no token
		return nil, false
	}
	n, rest, ok := bytes.Cut(rest, []byte("|"))
	if !ok {
		return nil, false
	}
	size, err := strconv.Atoi(string(n))
	if err != nil || size != len(fingerprint) || len(rest) < size || string(rest[:size]) != fingerprint {
		return nil, false
	}
	return rest[size:], true
}

// TakeNew takes key for tok and ttl with one plain SET NX, without a
// script and without a fence: for unfenced takes by a caller with no owner,
// outside the queue. It reports whether it took the key; a key that exists
// in any form (held, a tombstone, a queue flag) is left alone, for the
// acquire script to decide. The value written is the one the acquire
// script writes for such a take ("L1|<token>|0|"), so every other script
// reads it as its own. When ctx ends first, it returns ctx's error at once
// and late (if set) is called if the key was taken after all, to give it
// back.
func (b *Base) TakeNew(ctx context.Context, c SetNXer, key, tok string, ttl time.Duration, late func()) (bool, error) {
	var onLate func(*redis.BoolCmd)
	if late != nil {
		onLate = func(cmd *redis.BoolCmd) {
			if ok, err := cmd.Result(); err == nil && ok {
				late()
			}
		}
	}
	enforces := false
	if s, ok := c.(redis.Scripter); ok {
		enforces = EnforcesDeadlines(s)
	}
	return runCmd(ctx, &b.BG, enforces, redis.NewBoolCmd, func(ctx context.Context) *redis.BoolCmd {
		return c.SetNX(ctx, b.Keys.Lock(key), "L1|"+tok+"|0|", ttl)
	}, onLate).Result()
}

// Release runs the release script for tok: it frees key (or gives back one
// of an owner's holds) and wakes the first waiting process, or announces
// nothing when quiet. The key keeps its last fence, or floor when that is
// higher (Redlock: the lease's fence, the highest of its nodes'). clock is
// the reading of c's server clock that came with the token's fence
// (AcquireReply.Clock), or 0: a fence at or below it is known to be behind
// the clock, and the release saves reading it. plain says that tok took the
// key by a first attempt (AcquireReply.Plain, or TakeNew) and the hold
// was not passed on since: such a key seldom carries flags, and the
// release tries the short script first (lua/release_new.lua), which
// leaves a key with flags to the full one — a second round trip. issued,
// with plain, is the highest fence the token handed out (0: not known):
// the fences its take reserved above it were never used, and the key keeps
// only issued (or floor) — a fence at or below clock, the common case of a
// new key, then leaves no tombstone.
func (b *Base) Release(ctx context.Context, c redis.Scripter, key, tok string, quiet bool, floor uint64, clock int64, plain bool, issued uint64) (ReleaseCode, error) {
	return b.release(ctx, c, b.Keys.Lock(key), tok, quiet, floor, clock, plain, issued)
}

// release is Release by the lock's Redis name: every other name of the key
// is the lock's with a suffix (see Keys).
func (b *Base) release(ctx context.Context, c redis.Scripter, lock, tok string, quiet bool, floor uint64, clock int64, plain bool, issued uint64) (ReleaseCode, error) {
	if plain {
		cmd := b.run(ctx, c, ReleaseNew, []string{lock}, nil, tok, floor, max(clock, 0), issued)
		if !undecided(cmd) {
			return ParseRelease(cmd)
		}
	}
	keys := []string{lock, lock + ":owner", lock + ":q", lock + ":qx"}
	grants := "0"
	if b.Grants && !quiet {
		grants = "1"
	}
	mode := b.args.mode
	if quiet {
		mode = b.args.quiet
	}
	return ParseRelease(b.run(ctx, c, Release, keys, nil, tok, floor, max(clock, 0), lock+":release", mode, b.args.wakeGrace, grants))
}

// ReleaseOrphanGrant gives back a key that a release granted to this Store
// on its member channel after the waiter it was meant for had left: the key
// is held for a token nobody will use. It passes the key on as any release
// does. Messages that are not such a grant are ignored.
func (b *Base) ReleaseOrphanGrant(ctx context.Context, c redis.Scripter, channel, payload string) {
	lock, ok := strings.CutSuffix(channel, ":release:"+b.Member)
	tok, _, _, okTok := ParseGrant(payload)
	if !ok || !okTok || !strings.HasPrefix(lock, b.Keys.Prefix) {
		return
	}
	_, _ = b.release(ctx, c, lock, tok, false, 0, 0, false, 0)
}

// ParseGrant reads a grant message, "g|<token>|<fence>|<fences>"
// (release.lua): the granted hold's first fence and how many it has.
func ParseGrant(msg string) (tok string, fence, fences uint64, ok bool) {
	rest, ok := strings.CutPrefix(msg, redisnotify.GrantPrefix)
	if !ok {
		return "", 0, 0, false
	}
	parts := strings.Split(rest, "|")
	if len(parts) != 3 || parts[0] == "" {
		return "", 0, 0, false
	}
	fence, err1 := strconv.ParseUint(parts[1], 10, 64)
	fences, err2 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || fences == 0 {
		return "", 0, 0, false
	}
	return parts[0], fence, fences, true
}

// Refresh runs the refresh script: it reports whether tok still held key
// and now holds it for ttl.
func (b *Base) Refresh(ctx context.Context, c redis.Scripter, key, tok string, ttl time.Duration) (bool, error) {
	return ParseFlag(b.run(ctx, c, Refresh, []string{b.Keys.Lock(key), b.Keys.Owner(key)}, nil, tok, ttl.Milliseconds()))
}

// Transfer runs the transfer script: key passes from token from to token
// to (owner toOwner) for ttl without being let go. With Replication, the
// hand-off waits for the replicas as a take does: ErrNotReplicated says
// the key passed to to on the primary only.
func (b *Base) Transfer(ctx context.Context, c redis.Scripter, key, from, to string, ttl time.Duration, toOwner string) (TransferCode, uint64, uint64, error) {
	return ParseTransfer(b.run(ctx, c, Transfer, []string{b.Keys.Lock(key), b.Keys.Owner(key)}, nil,
		from, to, ttl.Milliseconds(), toOwner))
}

// LeaveQueue removes this Store from key's waiting queue.
func (b *Base) LeaveQueue(ctx context.Context, c redis.Scripter, key string) error {
	return LeaveQueue.Run(ctx, c, []string{b.Keys.Queue(key), b.Keys.QueueExpiry(key)}, b.Member).Err()
}

// Begin runs the idem_begin script for a claim with token tok. When ctx
// ends first, it returns at once and late (if set) receives the reply when
// it comes, to give back a claim nobody will use.
func (b *Base) Begin(ctx context.Context, c redis.Scripter, key idemdriver.Key, fingerprint, tok string, ttl time.Duration,
	late func(BeginReply)) (BeginReply, error) {
	var onLate func(*redis.Cmd)
	if late != nil {
		onLate = func(cmd *redis.Cmd) {
			if r, err := ParseBegin(valueOf(cmd)); err == nil {
				late(r)
			}
		}
	}
	acked := "0"
	if b.Replication.Replicas > 0 {
		acked = "1" // a replay, too, only once the replicas have the record
	}
	return ParseBegin(b.run(ctx, c, IdemBegin, []string{b.Records.Record(key)}, onLate,
		fingerprint, tok, ttl.Milliseconds(), acked))
}

// Finish runs the idem_finish script: op on the claim of tok, if it still
// holds key's record. d is the retention (Complete) or lease (Extend). The
// record keeps its fence, or floor when that is higher (Redlock: the
// claim's fence, the highest of its nodes').
func (b *Base) Finish(ctx context.Context, c redis.Scripter, key idemdriver.Key, tok string, op FinishOp, d time.Duration, result []byte, floor uint64) (bool, error) {
	rec := b.Records.Record(key)
	strict := "0"
	if b.StrictLeases {
		strict = "1"
	}
	return ParseFlag(b.run(ctx, c, IdemFinish, []string{rec}, nil,
		tok, string(op), d.Milliseconds(), result, recordChannel(rec), b.args.mode, floor, strict))
}

// RecordStatus reads key's record state for a caller about to wait for it
// (subscribed to its channel): "i" in flight, "c" completed, "" absent or
// not a record. An in-flight record is flagged so that its completion or
// abandonment is announced.
func (b *Base) RecordStatus(ctx context.Context, c redis.Scripter, key idemdriver.Key) (string, error) {
	return RecordStatus.Run(ctx, c, []string{b.Records.Record(key)}).Text()
}

// FinishContext is the context a Complete or Abandon runs under: the
// caller's, or a clean-up context when it has ended (the work is done and
// its record must be written). Extend keeps the caller's. A claim without a
// token was never ours: lock.ErrLockLost.
func FinishContext(ctx context.Context, c idemdriver.Claim, op FinishOp, driver string) (context.Context, context.CancelFunc, error) {
	if c.Token == "" {
		return nil, nil, fmt.Errorf("%s: %s %q: %w", driver, op, c.Key, lock.ErrLockLost)
	}
	if ctx.Err() != nil && op != Extend {
		cctx, cancel := lockdriver.CleanupContext(ctx)
		return cctx, cancel, nil
	}
	return ctx, func() {}, nil
}

// Claim converts a single server's begin reply into an idemdriver.Claim for a
// Begin that sent tok at now.
func (r BeginReply) Claim(key idemdriver.Key, fingerprint, tok string, ttl time.Duration, now time.Time) (idemdriver.Claim, error) {
	c := idemdriver.Claim{Key: key, Fingerprint: fingerprint, Expires: now.Add(time.Duration(r.N) * time.Millisecond)}
	switch r.Code {
	case BeginClaimed:
		c.State, c.Token, c.Fence, c.Attempt, c.Expires = idemdriver.Acquired, tok, uint64(r.N), int(r.Attempt), now.Add(ttl)
	case BeginInFlight:
		c.State = idemdriver.InFlight
	case BeginCompleted:
		c.State, c.Result = idemdriver.Completed, r.Result
	case BeginMismatch:
		c.State = idemdriver.Mismatch
	case BeginCorrupt:
		return idemdriver.Claim{}, idemdriver.CorruptRecord(key.String(), r.Reason)
	case BeginUnknownLayout:
		return idemdriver.Claim{}, r.LayoutError(key, "")
	}
	return c, nil
}

// RecordLayout is the layout of the records this version writes and reads
// (lua/claim.lua).
const RecordLayout = "R2"

// LayoutError is the error of a BeginUnknownLayout reply (node names the
// Redlock node that gave it, "" for one server).
func (r BeginReply) LayoutError(key idemdriver.Key, node string) error {
	at := ""
	if node != "" {
		at = " on " + node
	}
	return fmt.Errorf("%w: the record of %q%s is of layout %s, this version reads %s (a version that wrote it is still running, or this one is older: it is left alone until it expires)",
		idem.ErrUnknownLayout, key, at, r.Reason, RecordLayout)
}

// Client is what both Redis drivers need of a go-redis client (for
// redlockstore, of each node's): scripts, pub/sub and INFO (to pick
// sharded or classic pub/sub). *redis.Client, *redis.ClusterClient and the
// other redis.UniversalClient implementations satisfy it.
type Client interface {
	redis.Scripter
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
	Info(ctx context.Context, section ...string) *redis.StringCmd
	Time(ctx context.Context) *redis.TimeCmd
}

// Finisher implements idemdriver.Store's Complete, Abandon and Extend over the
// driver's one finish call; a driver's Store embeds it.
type Finisher struct {
	FinishClaim func(ctx context.Context, c idemdriver.Claim, op FinishOp, d time.Duration, result []byte) error
}

// Complete implements idemdriver.Store.
func (f Finisher) Complete(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration) error {
	if err := lockdriver.ValidateTTL(retention); err != nil {
		return err
	}
	return f.FinishClaim(ctx, c, Complete, retention, result)
}

// Abandon implements idemdriver.Store.
func (f Finisher) Abandon(ctx context.Context, c idemdriver.Claim) error {
	return f.FinishClaim(ctx, c, Abandon, time.Millisecond, nil)
}

// Extend implements idemdriver.Store.
func (f Finisher) Extend(ctx context.Context, c idemdriver.Claim, ttl time.Duration) error {
	if err := lockdriver.ValidateTTL(ttl); err != nil {
		return err
	}
	return f.FinishClaim(ctx, c, Extend, ttl, nil)
}

// CommitReply is the idem_commit script's verdict.
type CommitReply struct {
	Ours    bool   // the claim was ours (else nothing ran)
	Refused bool   // the effect refused: nothing written
	Reason  string // the effect's reason for refusing
}

// Commit runs an effect script: the claim of tok on key completes with
// result for retention, and the effect runs with keys and args, in one
// script.
func (b *Base) Commit(ctx context.Context, c redis.Scripter, es *EffectScript, key idemdriver.Key, tok string, retention time.Duration,
	result []byte, keys []string, args []any) (CommitReply, error) {
	all := append([]string{b.Records.Record(key)}, keys...)
	argv := append([]any{tok, retention.Milliseconds(), result, b.Records.Channel(key), b.mode(false)}, args...)
	v, err := b.run(ctx, c, es.script, all, nil, argv...).Slice()
	if err != nil {
		return CommitReply{}, err
	}
	var code int64
	var reason string
	ok := len(v) == 2
	if ok {
		code, ok = v[0].(int64)
	}
	if ok {
		reason, ok = v[1].(string)
	}
	if !ok || code < 0 || code > 2 {
		return CommitReply{}, fmt.Errorf("unexpected commit script reply %v", v)
	}
	return CommitReply{Ours: code != 0, Refused: code == 2, Reason: reason}, nil
}
