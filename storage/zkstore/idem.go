package zkstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// MaxResultBytes is the largest result a record stores: a ZooKeeper
// request is at most jute.maxbuffer (1 MiB by default) with the record's
// other fields.
const MaxResultBytes = 1<<20 - 64<<10

// A record is one persistent znode, "<root>/idem/<bucket>/<escaped key>":
//
//	1 byte  format (1, or 2 with the attempt)
//	1 byte  state: 'f' in flight, 'c' completed, 'a' abandoned
//	8 bytes fence, or 0 while the fence is the node's last write (mzxid)
//	8 bytes lease (in flight), retention (completed) or memory
//	        (abandoned: idem.AttemptMemory), in ms
//	4 bytes the claim's attempt (format 2 only; format 1 is attempt 1)
//	2 bytes + token, 2 bytes + fingerprint, then the result
//
// Its expiry is the node's last modification time (the servers' clock) +
// the lease or retention: every write is a versioned compare-and-set, so a
// claim whose lease ran out by the servers' clock is taken over by exactly
// one Begin, and its old holder's writes fail. An in-flight record past its
// lease, and an abandoned one, are the memory of a claim that ended
// without completing: the next claim's attempt is one more than theirs
// (for idem.AttemptMemory; Cleanup keeps them that long). Formats 1 and 2
// are oncekit v0.1.0's (an in-flight or completed record of attempt 1 is
// written in format 1, the others in format 2), and every later version
// reads both; a record of another format is idem.ErrUnknownLayout, never
// taken over.
type record struct {
	completed   bool
	abandoned   bool
	fence       uint64
	dur         time.Duration
	attempt     int
	token       string
	fingerprint string
	result      []byte
}

const (
	recFormat    = 1
	recFormat2   = 2
	recInFlight  = 'f'
	recCompleted = 'c'
	recAbandoned = 'a'
	recHeader    = 1 + 1 + 8 + 8
)

func (r record) encode() []byte {
	b := make([]byte, 0, recHeader+8+len(r.token)+len(r.fingerprint)+len(r.result))
	state, format := byte(recInFlight), byte(recFormat)
	switch {
	case r.completed:
		state = recCompleted
	case r.abandoned:
		state, format = recAbandoned, recFormat2
	case r.attempt > 1:
		format = recFormat2
	}
	b = append(b, format, state)
	b = binary.BigEndian.AppendUint64(b, r.fence)
	b = binary.BigEndian.AppendUint64(b, uint64(r.dur.Milliseconds()))
	if format == recFormat2 {
		b = binary.BigEndian.AppendUint32(b, uint32(r.attempt))
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.token)))
	b = append(b, r.token...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.fingerprint)))
	b = append(b, r.fingerprint...)
	return append(b, r.result...)
}

func decodeRecord(b []byte) (record, string) {
	if len(b) < recHeader+4 {
		return record{}, fmt.Sprintf("%d bytes, shorter than any record", len(b))
	}
	if b[0] != recFormat && b[0] != recFormat2 {
		return record{}, fmt.Sprintf("%s%d", layoutPrefix, b[0])
	}
	r := record{attempt: 1}
	switch b[1] {
	case recInFlight:
	case recCompleted:
		r.completed = true
	case recAbandoned:
		r.abandoned = true
	default:
		return record{}, fmt.Sprintf("unknown state %q", b[1])
	}
	if r.abandoned && b[0] != recFormat2 {
		return record{}, "an abandoned record without its attempt"
	}
	r.fence = binary.BigEndian.Uint64(b[2:])
	ms := binary.BigEndian.Uint64(b[10:])
	if ms == 0 || ms > uint64(100*365*24*time.Hour/time.Millisecond) {
		return record{}, fmt.Sprintf("duration %d ms out of range", ms)
	}
	r.dur = time.Duration(ms) * time.Millisecond
	rest := b[recHeader:]
	if b[0] == recFormat2 {
		if len(rest) < 4+4 {
			return record{}, "truncated attempt"
		}
		r.attempt = int(binary.BigEndian.Uint32(rest))
		rest = rest[4:]
		if r.attempt < 1 {
			return record{}, fmt.Sprintf("attempt %d", r.attempt)
		}
	}
	field := func() (string, bool) {
		if len(rest) < 2 {
			return "", false
		}
		n := int(binary.BigEndian.Uint16(rest))
		if len(rest) < 2+n {
			return "", false
		}
		v := string(rest[2 : 2+n])
		rest = rest[2+n:]
		return v, true
	}
	var ok bool
	if r.token, ok = field(); !ok || r.token == "" {
		return record{}, "truncated or empty token"
	}
	if r.fingerprint, ok = field(); !ok {
		return record{}, "truncated fingerprint"
	}
	if !r.completed && len(rest) > 0 {
		return record{}, "an in-flight or abandoned record with a result"
	}
	r.result = rest
	return r, ""
}

// fenceOf is the record's fence: written in it, or its node's last write.
func (r record) fenceOf(st *zk.Stat) uint64 {
	if r.fence != 0 {
		return r.fence
	}
	return uint64(st.Mzxid)
}

// expiresMs is when the record's lease or retention ends, by the servers'
// clock (Unix ms).
func (r record) expiresMs(st *zk.Stat) int64 { return st.Mtime + r.dur.Milliseconds() }

// forgottenMs is when Cleanup may delete the record (Unix ms, the
// servers' clock): an in-flight record is kept idem.AttemptMemory past its
// lease, for the next claim's attempt.
func (r record) forgottenMs(st *zk.Stat) int64 {
	if !r.completed && !r.abandoned {
		return r.expiresMs(st) + idem.AttemptMemory.Milliseconds()
	}
	return r.expiresMs(st)
}

// nextAttempt is the attempt of a claim that takes over rec, which ended
// (v) at exp: one more than rec's when rec is a claim that ended without
// completing, within idem.AttemptMemory, else 1.
func (r record) nextAttempt(v verdict, exp int64) int {
	switch {
	case r.abandoned && v == live: // (an abandoned record lives for the memory)
		return r.attempt + 1
	case !r.abandoned && !r.completed && time.Now().UnixMilli() < exp+idem.AttemptMemory.Milliseconds():
		return r.attempt + 1
	}
	return 1
}

// verdict is what a record's lease or retention has come to.
type verdict int

const (
	live    verdict = iota // not ended
	ended                  // ended, by the clock of the leader that stamped it
	restamp                // stamped by an earlier leader: write it again before judging
)

// judge decides a record last written at st, whose lease or retention
// ends at exp by the clock of the leader that stamped st.Mtime, against
// now. A record stamped under an earlier leader is never judged ended by
// the current leader's clock — the two machines' clocks may disagree by
// more than a lease, and a live claim would be taken over — but written
// again (restamp): its time restarts under the current leader, so it ends
// at most one lease or retention later than it would have.
func judge(exp int64, st *zk.Stat, now serverClock) verdict {
	switch {
	case now.ms < exp:
		return live
	case epochOf(st.Mzxid) != now.epoch:
		return restamp
	}
	return ended
}

// expired judges a record (judge): at once live when this process's
// clock says it has not ended (a clock behind the servers' only keeps a
// record a little longer), else by asking the servers' clock.
func (s *Store) expired(ctx context.Context, exp int64, st *zk.Stat) (verdict, error) {
	if time.Now().UnixMilli() < exp {
		return live, nil
	}
	now, err := s.serverNow(ctx)
	if err != nil {
		return live, err
	}
	return judge(exp, st, now), nil
}

// restampRecord writes rec back unchanged but for its fence, made
// explicit (a new write moves the node's mzxid), so that the current
// leader stamps its time; the claim's holder reads it and goes on. It
// returns the new Stat, or ErrBadVersion/ErrNoNode when the record
// changed meanwhile.
func (s *Store) restampRecord(ctx context.Context, path string, rec record, st *zk.Stat) (*zk.Stat, error) {
	rec.fence = rec.fenceOf(st)
	return call(ctx, s, func() (*zk.Stat, error) { return s.conn.Set(path, rec.encode(), st.Version) }, nil)
}

// Begin implements idemdriver.Store: one request for a new key (a transaction
// that creates the record), two for a key with a live record (the create
// fails, the record is read), and one more to take over a record whose
// lease or retention ended.
func (s *Store) Begin(ctx context.Context, k idemdriver.Key, fingerprint string, ttl time.Duration) (idemdriver.Claim, error) {
	if err := s.checkBegin(k, fingerprint, ttl); err != nil {
		return idemdriver.Claim{}, err
	}
	key := k.String()
	path := s.recordPath(key)
	for range 16 {
		start := time.Now()
		tok := token.New()
		data := record{dur: ttl, token: tok, fingerprint: fingerprint}.encode()
		acquired := func(st *zk.Stat, attempt int) idemdriver.Claim {
			s.versions.store(tok, st.Version, ttl)
			return idemdriver.Claim{Key: k, State: idemdriver.Acquired, Fingerprint: fingerprint, Token: tok,
				Fence: uint64(st.Mzxid), Attempt: attempt, Expires: start.Add(ttl)}
		}
		r, err := call(ctx, s, func() ([]zk.MultiResponse, error) {
			return s.conn.Multi(
				&zk.CreateRequest{Path: path, Data: data, Acl: zk.WorldACL(zk.PermAll)},
				&zk.SetDataRequest{Path: path, Data: data, Version: -1}, // its Stat carries the zxid: the fence
			)
		}, func(r []zk.MultiResponse, err error) { // a claim ctx gave up on: given back
			if err == nil && len(r) == 2 && r[1].Stat != nil {
				s.deleteVersion(path, r[1].Stat.Version)
			}
		})
		switch {
		case err == nil && len(r) == 2 && r[1].Stat != nil:
			return acquired(r[1].Stat, 1), nil
		case errors.Is(err, zk.ErrNoNode): // the bucket's directory
			if err := s.ensure(ctx, path[:len(path)-len(escape(key))-1]); err != nil {
				return idemdriver.Claim{}, s.idemErr(ctx, "begin", key, err)
			}
			continue
		case err != nil && !errors.Is(err, zk.ErrNodeExists):
			return idemdriver.Claim{}, s.idemErr(ctx, "begin", key, err)
		}
		rec, st, err := s.read(ctx, key, path)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			continue // deleted meanwhile
		case err != nil:
			return idemdriver.Claim{}, s.idemErr(ctx, "begin", key, err)
		}
		exp := rec.expiresMs(st)
		v, err := s.expired(ctx, exp, st)
		if err != nil {
			return idemdriver.Claim{}, s.idemErr(ctx, "begin", key, err)
		}
		if v == restamp {
			nst, err := s.restampRecord(ctx, path, rec, st)
			switch {
			case errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNoNode):
				continue // written or deleted meanwhile: look again
			case err != nil:
				return idemdriver.Claim{}, s.idemErr(ctx, "begin", key, err)
			}
			exp, v = rec.expiresMs(nst), live
		}
		if v == live && !rec.abandoned {
			return rec.answer(k, fingerprint, exp), nil
		}
		attempt := rec.nextAttempt(v, exp)
		if attempt > 1 {
			data = record{dur: ttl, attempt: attempt, token: tok, fingerprint: fingerprint}.encode()
		}
		st, err = call(ctx, s, func() (*zk.Stat, error) { return s.conn.Set(path, data, st.Version) },
			func(nst *zk.Stat, err error) { // a takeover ctx gave up on: given back, its attempt kept
				if err == nil && nst != nil {
					s.giveBackTakeover(path, record{abandoned: true, dur: idem.AttemptMemory, attempt: attempt,
						token: tok, fingerprint: fingerprint}, nst.Version)
				}
			})
		switch {
		case err == nil:
			return acquired(st, attempt), nil
		case errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNoNode):
			continue // another Begin took it over, or it was deleted
		default:
			return idemdriver.Claim{}, s.idemErr(ctx, "begin", key, err)
		}
	}
	return idemdriver.Claim{}, fmt.Errorf("zkstore: begin %q: the record kept changing", key)
}

// checkBegin checks what Begin is asked: a Key, a TTL, a fingerprint a
// record can hold, an open Store.
func (s *Store) checkBegin(k idemdriver.Key, fingerprint string, ttl time.Duration) error {
	if err := k.Check(); err != nil {
		return err
	}
	if err := lockdriver.ValidateTTL(ttl); err != nil {
		return err
	}
	if err := s.closedErr("begin", k.String()); err != nil {
		return err
	}
	if len(fingerprint) > 1<<16-1 {
		return fmt.Errorf("zkstore: begin %q: a fingerprint of %d bytes (at most 65535)", k.String(), len(fingerprint))
	}
	return nil
}

// answer is the claim Begin answers for a live record that is not
// abandoned (exp: when it expires, ms): a mismatch, a completion, or a
// run in flight.
func (rec record) answer(k idemdriver.Key, fingerprint string, exp int64) idemdriver.Claim {
	c := idemdriver.Claim{Key: k, Fingerprint: fingerprint, Expires: time.UnixMilli(exp)}
	switch {
	case rec.fingerprint != fingerprint:
		c.State = idemdriver.Mismatch
	case rec.completed:
		c.State, c.Result = idemdriver.Completed, rec.result
	default:
		c.State = idemdriver.InFlight
	}
	return c
}

// giveBackTakeover writes rec, an abandoned record, over the record a
// takeover wrote at version after its caller had given up on it: the key
// is free for the next Begin at once (not when the lease ends), which
// counts the claim given back as an attempt (an abandon, not a delete,
// which would forget the attempts before it).
func (s *Store) giveBackTakeover(path string, rec record, version int32) {
	cctx, cancel := lockdriver.CleanupContext(context.Background())
	defer cancel()
	_, _ = call(cctx, s, func() (*zk.Stat, error) { return s.conn.Set(path, rec.encode(), version) }, nil)
}

// read reads key's record; a record that is not one of ours is a
// idemdriver.CorruptRecord.
func (s *Store) read(ctx context.Context, key, path string) (record, *zk.Stat, error) {
	data, st, err := s.get(ctx, path)
	if err != nil {
		return record{}, nil, err
	}
	rec, corrupt := decodeRecord(data)
	if layout, ok := strings.CutPrefix(corrupt, layoutPrefix); ok {
		return record{}, st, fmt.Errorf("%w: the record of %q is of format %s, this version reads formats %d and %d (a version that wrote it is still running, or this one is older: it is left alone)",
			idem.ErrUnknownLayout, key, layout, recFormat, recFormat2)
	}
	if corrupt != "" {
		return record{}, st, idemdriver.CorruptRecord(key, corrupt)
	}
	return rec, st, nil
}

// layoutPrefix starts decodeRecord's reason for a record of a format this
// version does not read (idem.ErrUnknownLayout, not a corrupt record): a
// later version's, during a rolling deploy.
const layoutPrefix = "format "

// Complete implements idemdriver.Store: one request when this Store made the
// claim's last write (it knows the record's version), two otherwise.
func (s *Store) Complete(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration) error {
	if err := lockdriver.ValidateTTL(retention); err != nil {
		return err
	}
	if len(result) > MaxResultBytes {
		return fmt.Errorf("zkstore: complete %q: %w: %d bytes, ZooKeeper's limit here %d", c.Key, idem.ErrResultTooLarge, len(result), MaxResultBytes)
	}
	err := s.finish(ctx, c, "complete", retention, func(rec record) ([]byte, bool) {
		rec.completed, rec.dur, rec.result = true, retention, result
		return rec.encode(), true
	})
	if err == nil {
		s.versions.forget(c.Token)
	}
	return err
}

// Abandon implements idemdriver.Store: the claim's record becomes an abandoned
// one, free for the next Begin, which counts it (idemdriver.Claim.Attempt).
func (s *Store) Abandon(ctx context.Context, c idemdriver.Claim) error {
	err := s.finish(ctx, c, "abandon", 0, func(rec record) ([]byte, bool) {
		rec.abandoned, rec.dur = true, idem.AttemptMemory
		return rec.encode(), true
	})
	s.versions.forget(c.Token)
	return err
}

// Extend implements idemdriver.Store: a new lease from the servers' clock at the
// write, which comes after the call began.
func (s *Store) Extend(ctx context.Context, c idemdriver.Claim, ttl time.Duration) error {
	if err := lockdriver.ValidateTTL(ttl); err != nil {
		return err
	}
	return s.finish(ctx, c, "extend", ttl, func(rec record) ([]byte, bool) {
		rec.dur = ttl
		return rec.encode(), true
	})
}

// finish writes what next makes of c's record (or deletes it, when next
// says so), if c still holds it: a versioned write, first with the version
// this Store last wrote for the claim, else with the one just read. A
// claim is lost once another Begin took the record over (which needs its
// lease to have ended by the servers' clock) or it was deleted; a claim
// whose lease ended but that nobody took over still finishes, as no other
// run can have started.
func (s *Store) finish(ctx context.Context, c idemdriver.Claim, op string, ttl time.Duration, next func(record) ([]byte, bool)) (err error) {
	key := c.Key.String()
	if err := c.Key.Check(); err != nil {
		return err
	}
	defer func() {
		if errors.Is(err, lock.ErrLockLost) {
			s.versions.forget(c.Token)
		}
	}()
	lost := fmt.Errorf("zkstore: %s %q: %w", op, c.Key, lock.ErrLockLost)
	if c.Token == "" {
		return lost
	}
	path := s.recordPath(key)
	mine := record{fence: c.Fence, attempt: max(c.Attempt, 1), token: c.Token, fingerprint: c.Fingerprint}
	version := int32(-2) // unknown
	if v, ok := s.versions.load(c.Token); ok {
		version = v
	}
	for attempt := 0; attempt < 2; attempt++ {
		if version == -2 || attempt == 1 {
			rec, st, err := s.read(ctx, key, path)
			switch {
			case errors.Is(err, zk.ErrNoNode) || errors.Is(err, idem.ErrCorruptRecord):
				return lost
			case err != nil:
				return s.idemErr(ctx, op, key, err)
			case rec.completed || rec.abandoned || rec.token != c.Token || rec.fenceOf(st) != c.Fence:
				return lost
			}
			mine, version = rec, st.Version
			mine.fence = rec.fenceOf(st)
		}
		data, keep := next(mine)
		var err error
		if keep {
			var st *zk.Stat
			st, err = call(ctx, s, func() (*zk.Stat, error) { return s.conn.Set(path, data, version) }, nil)
			if err == nil {
				s.versions.store(c.Token, st.Version, ttl)
			}
		} else {
			_, err = call(ctx, s, func() (struct{}, error) { return struct{}{}, s.conn.Delete(path, version) }, nil)
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, zk.ErrNoNode):
			return lost
		case errors.Is(err, zk.ErrBadVersion):
			continue // read and check again
		default:
			return s.idemErr(ctx, op, key, err)
		}
	}
	return lost
}

// WaitChange implements idemdriver.Waiter: it returns when key's record changes
// or goes (a watch on its node), at until, or when ctx ends.
func (s *Store) WaitChange(ctx context.Context, k idemdriver.Key, until time.Time) error {
	key := k.String()
	if err := lockdriver.ValidateKey(key); err != nil {
		return err
	}
	if err := s.closedErr("wait for", key); err != nil {
		return err
	}
	type res struct {
		ok bool
		ch <-chan zk.Event
	}
	r, err := call(ctx, s, func() (res, error) {
		data, _, ch, err := s.conn.GetW(s.recordPath(key))
		if errors.Is(err, zk.ErrNoNode) {
			return res{}, nil
		}
		rec, corrupt := decodeRecord(data)
		// Still in flight: wait for its change. Anything else (gone,
		// abandoned, completed, corrupt): the caller looks again.
		return res{err == nil && corrupt == "" && !rec.completed && !rec.abandoned, ch}, err
	}, nil)
	if err != nil || !r.ok {
		return ctx.Err() // a store error is the caller's Begin's to report
	}
	wait := time.Until(until)
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-r.ch:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

func (s *Store) idemErr(ctx context.Context, op, key string, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = errors.Join(ctx.Err(), err)
	}
	if s.isClosed() {
		return fmt.Errorf("zkstore: %s %q: %w (%w)", op, key, lock.ErrClosed, err)
	}
	return fmt.Errorf("zkstore: %s %q: %w", op, key, err)
}

var (
	_ idemdriver.Store  = (*Store)(nil)
	_ idemdriver.Waiter = (*Store)(nil)
)
