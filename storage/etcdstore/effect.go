package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
)

// Effect is a write that commits atomically with an idempotency record:
// its comparisons and operations join the transaction that completes the
// record. When the claim is still ours but If does not hold, nothing is
// written and the completion fails with an *idem.EffectRefusedError
// carrying Reason. Pass it to idem.Commit in a Guard's run (or
// httpmw.Commit in a handler).
type Effect struct {
	If     []clientv3.Cmp
	Then   []clientv3.Op
	Reason string // why If failing refuses the effect; default "condition failed"
}

// CompleteWith implements idemdriver.EffectStore: the record's completion and the
// Effect in one transaction, after a read of the claim's entry (two round
// trips).
func (s *Store) CompleteWith(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration, effect any) error {
	e, ok := effect.(Effect)
	if p, isPtr := effect.(*Effect); isPtr && p != nil {
		e, ok = *p, true
	}
	if !ok {
		return fmt.Errorf("etcdstore: complete %q: %T is not an etcdstore.Effect: %w", c.Key, effect, idem.ErrEffectUnsupported)
	}
	ctx, cancel := cleanupIfDone(ctx)
	defer cancel()
	entry, val, lease, err := s.completion(ctx, c, result, retention)
	if err != nil {
		return err
	}
	for range 3 {
		// Read the claim's entry, then commit on its mod revision: the
		// transaction applies the effect only to a claim still in flight
		// (not one an earlier attempt completed already).
		g, err := s.c.Get(ctx, entry)
		if err != nil {
			return fmt.Errorf("etcdstore: complete %q: %w", c.Key, err)
		}
		if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != int64(c.Fence) {
			return fmt.Errorf("etcdstore: complete %q: %w", c.Key, lock.ErrLockLost)
		}
		cur, err := decodeRecord(c.Key.String(), g.Kvs[0].Value)
		switch {
		case err != nil:
			return err
		case cur.state == stateCompleted:
			return nil // an earlier attempt, whose reply was lost, committed both
		case !time.Now().Before(cur.expires):
			return fmt.Errorf("etcdstore: complete %q: %w", c.Key, lock.ErrLockLost)
		}
		mod := g.Kvs[0].ModRevision
		t, err := s.c.Txn(ctx).
			If(append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(entry), "=", mod)}, e.If...)...).
			Then(append([]clientv3.Op{clientv3.OpPut(entry, val, clientv3.WithLease(lease)), clientv3.OpDelete(s.attemptsKey(c.Key.String()))}, e.Then...)...).
			Else(clientv3.OpGet(entry, clientv3.WithKeysOnly())).
			Commit()
		if rejected(err) {
			// The server rejected the transaction itself (a key given
			// twice, too many operations, too large): an answer that
			// asking again would repeat. Nothing was written.
			return &idem.EffectFailedError{Key: c.Key.String(), Err: fmt.Errorf("etcdstore: %w", err)}
		}
		if err != nil {
			return fmt.Errorf("etcdstore: complete %q: %w", c.Key, err)
		}
		if t.Succeeded {
			s.stopClaimTimer(entry)
			return nil
		}
		if kvs := t.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 && kvs[0].ModRevision == mod {
			reason := e.Reason
			if reason == "" {
				reason = "condition failed"
			}
			return &idem.EffectRefusedError{Key: c.Key.String(), Reason: reason}
		}
		// The entry changed between the read and the transaction (a last
		// Extend): read it again.
	}
	return fmt.Errorf("etcdstore: complete %q: the claim's entry keeps changing", c.Key)
}

// rejected reports an error by which the server refused a request as
// malformed (a key given twice in one transaction, too many operations, a
// request too large), not a fault that a retry could get past.
func rejected(err error) bool {
	var ee rpctypes.EtcdError
	return errors.As(err, &ee) && ee.Code() == codes.InvalidArgument
}

var _ idemdriver.EffectStore = (*Store)(nil)
