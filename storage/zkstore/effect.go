package zkstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// Effect is a write that commits atomically with an idempotency record:
// its operations — *zk.CreateRequest, *zk.SetDataRequest,
// *zk.DeleteRequest and *zk.CheckVersionRequest, with versions as
// conditions — join the multi-operation transaction that completes the
// record. When the claim is still ours but one of them fails (a version
// that moved on, a node that exists or is missing), nothing is written and
// the completion fails with an *idem.EffectRefusedError carrying Reason.
// Pass it to idem.Commit in a Guard's run (or httpmw.Commit in a handler).
type Effect struct {
	Ops    []any
	Reason string // why a failed operation refuses the effect; default "condition failed"
}

// maxRequestBytes is the largest request the Store sends: ZooKeeper's
// default jute.maxbuffer (1 MiB − 1), less room for the framing.
const maxRequestBytes = 1<<20 - 1024

// multiSize is an upper bound on the encoded size of a multi request of
// ops (jute: lengths and fields of 4 or 8 bytes, per-op headers).
func multiSize(ops []any) int {
	n := 16
	for _, op := range ops {
		n += 16
		switch o := op.(type) {
		case *zk.CreateRequest:
			n += 12 + len(o.Path) + len(o.Data)
			for _, a := range o.Acl {
				n += 12 + len(a.Scheme) + len(a.ID)
			}
		case *zk.SetDataRequest:
			n += 12 + len(o.Path) + len(o.Data)
		case *zk.DeleteRequest:
			n += 8 + len(o.Path)
		case *zk.CheckVersionRequest:
			n += 8 + len(o.Path)
		}
	}
	return n
}

// CompleteWith implements idemdriver.EffectStore: the record's completion and
// the Effect in one transaction (one request when this Store made the
// claim's last write, after a read otherwise).
func (s *Store) CompleteWith(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration, effect any) (err error) {
	key := c.Key.String()
	e, ok := effect.(Effect)
	if p, isPtr := effect.(*Effect); isPtr && p != nil {
		e, ok = *p, true
	}
	if !ok {
		return fmt.Errorf("zkstore: complete %q: %T is not a zkstore.Effect: %w", c.Key, effect, idem.ErrEffectUnsupported)
	}
	if err := lockdriver.ValidateTTL(retention); err != nil {
		return err
	}
	if len(result) > MaxResultBytes {
		return fmt.Errorf("zkstore: complete %q: %w: %d bytes, ZooKeeper's limit here %d", c.Key, idem.ErrResultTooLarge, len(result), MaxResultBytes)
	}
	for _, op := range e.Ops {
		switch op.(type) {
		case *zk.CreateRequest, *zk.SetDataRequest, *zk.DeleteRequest, *zk.CheckVersionRequest:
		default:
			return &idem.EffectFailedError{Key: key, Err: fmt.Errorf("zkstore: an Effect operation of type %T", op)}
		}
	}
	lost := fmt.Errorf("zkstore: complete %q: %w", c.Key, lock.ErrLockLost)
	if c.Token == "" {
		return lost
	}
	defer func() {
		if errors.Is(err, lock.ErrLockLost) {
			s.versions.forget(c.Token)
		}
	}()
	path := s.recordPath(key)
	version := int32(-2)
	if v, ok := s.versions.load(c.Token); ok {
		version = v
	}
	for attempt := range 3 {
		if version == -2 || attempt > 0 {
			rec, st, err := s.read(ctx, key, path)
			switch {
			case errors.Is(err, zk.ErrNoNode) || errors.Is(err, idem.ErrCorruptRecord):
				return lost
			case err != nil:
				return s.idemErr(ctx, "complete", key, err)
			case rec.abandoned || rec.token != c.Token || rec.fenceOf(st) != c.Fence:
				return lost
			case rec.completed:
				return nil // an earlier attempt, whose reply was lost, committed both
			}
			version = st.Version
		}
		data := record{completed: true, fence: c.Fence, dur: retention, token: c.Token, fingerprint: c.Fingerprint, result: result}.encode()
		ops := append([]any{&zk.SetDataRequest{Path: path, Data: data, Version: version}}, e.Ops...)
		if n := multiSize(ops); n > maxRequestBytes {
			// Sent, it would drop the session's connection (the servers
			// refuse a request over jute.maxbuffer), and every retry
			// again: an answer, not a fault.
			return &idem.EffectFailedError{Key: key, Err: fmt.Errorf(
				"zkstore: the completion with its effect encodes to about %d bytes, over ZooKeeper's request limit of %d (jute.maxbuffer)", n, maxRequestBytes)}
		}
		r, err := call(ctx, s, func() ([]zk.MultiResponse, error) { return s.conn.Multi(ops...) }, nil)
		if err == nil {
			s.versions.forget(c.Token)
			return nil
		}
		if len(r) != len(ops) {
			// No per-operation answer: the request failed as a whole (a
			// lost connection: it may have run, and the next read says).
			if attempt < 2 && errors.Is(err, zk.ErrConnectionClosed) {
				continue
			}
			return s.idemErr(ctx, "complete", key, err)
		}
		// A failed multi answers each operation: those before the failure
		// OK, the failure its error, those after a rollback code.
		failed := slices.IndexFunc(r, func(m zk.MultiResponse) bool { return m.Error != nil })
		switch {
		case failed < 0:
			return s.idemErr(ctx, "complete", key, err)
		case failed == 0 && errors.Is(r[0].Error, zk.ErrBadVersion):
			continue // written since (an Extend): read again
		case failed == 0 && errors.Is(r[0].Error, zk.ErrNoNode):
			return lost
		case failed == 0:
			return s.idemErr(ctx, "complete", key, r[0].Error)
		case !isCondition(r[failed].Error):
			return &idem.EffectFailedError{Key: key, Err: fmt.Errorf("zkstore: effect operation %d: %w", failed-1, r[failed].Error)}
		}
		reason := e.Reason
		if reason == "" {
			reason = "condition failed"
		}
		return &idem.EffectRefusedError{Key: key, Reason: reason}
	}
	return fmt.Errorf("zkstore: complete %q: the claim's record keeps changing", c.Key)
}

// isCondition reports an operation's failure that is a condition of the
// effect not holding, not a malformed request.
func isCondition(err error) bool {
	return errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNodeExists) || errors.Is(err, zk.ErrNoNode) ||
		errors.Is(err, zk.ErrNotEmpty)
}

var _ idemdriver.EffectStore = (*Store)(nil)
