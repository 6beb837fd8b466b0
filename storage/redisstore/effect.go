package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// EffectScript is Lua that commits with an idempotency record (Effect).
// Make one per effect with NewEffectScript and keep it: like a
// redis.Script it is loaded once and sent as EVALSHA.
type EffectScript struct{ s *rediskit.EffectScript }

// NewEffectScript makes an effect from lua, the body of a Lua function
// effect(KEYS, ARGV): KEYS and ARGV are the Effect's. It returns nothing
// (nil) to go ahead, or a reason (a string) to refuse, in which case
// neither the effect nor the record is written. It must check before it
// writes: Redis does not roll a script back, so a write made before a
// refusal or an error stays. A script that fails with an error (a
// redis.error_reply, a command on a key of the wrong type) is not
// retried: the Guard abandons the claim and returns an
// *idem.EffectFailedError.
//
//	var sell = redisstore.NewEffectScript(`
//	  local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
//	  if stock < tonumber(ARGV[1]) then return 'sold_out' end
//	  redis.call('DECRBY', KEYS[1], ARGV[1])
//	`)
func NewEffectScript(lua string) *EffectScript {
	return &EffectScript{rediskit.NewEffectScript(lua)}
}

// Effect is a write that commits atomically with an idempotency record:
// pass it to idem.Commit in a Guard's run (or httpmw.Commit in a handler),
// and the record's completion and the effect run as one script. A process
// that dies after the run leaves neither done, so the retry runs the
// effect once; one that dies after the script finds the record completed
// on retry, and replays it.
//
// Under Redis Cluster every key in Keys must live in the record's hash
// slot. Either place the record where the keys are — a stored key made by
// idem.Placed(place, key) (or a middleware's WithPlacement) has its
// record in the slot of the hash tag {place}, so keys named "...{place}..."
// qualify — or name the keys after the record with EffectKey. On one
// server (or Sentinel) any keys do.
type Effect struct {
	Script *EffectScript
	Keys   []string
	Args   []any
}

// EffectKey names a key in the same Cluster hash slot as the record of
// the idempotency key storedKey (the key the Guard stores, idem.KeyFrom):
// name followed by the record's hash tag ({place} for a placed key).
func EffectKey(storedKey, name string) string {
	if place, ok := idemdriver.PlaceOf(storedKey); ok {
		return name + "{" + place + "}"
	}
	return name + "{" + rediskit.Tag(storedKey) + "}"
}

// CompleteWith implements idemdriver.EffectStore: the claim's completion and the
// Effect in one script, one round trip.
func (s *Store) CompleteWith(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration, effect any) error {
	e, ok := effect.(Effect)
	if p, isPtr := effect.(*Effect); isPtr && p != nil {
		e, ok = *p, true
	}
	if !ok || e.Script == nil {
		return fmt.Errorf("redisstore: complete %q: %T is not a redisstore.Effect: %w", c.Key, effect, idem.ErrEffectUnsupported)
	}
	ctx, cancel, err := rediskit.FinishContext(ctx, c, rediskit.Complete, "redisstore")
	if err != nil {
		return err
	}
	defer cancel()
	r, err := s.base.Commit(ctx, s.client, e.Script.s, c.Key, c.Token, retention, result, e.Keys, e.Args)
	switch {
	case rediskit.IsReply(err): // an error reply: the script ran and failed, an answer
		return &idem.EffectFailedError{Key: c.Key.String(), Err: fmt.Errorf("redisstore: %w", err)}
	case err != nil:
		return fmt.Errorf("redisstore: complete %q: %w", c.Key, err)
	case !r.Ours:
		return fmt.Errorf("redisstore: complete %q: %w", c.Key, lock.ErrLockLost)
	case r.Refused:
		return &idem.EffectRefusedError{Key: c.Key.String(), Reason: r.Reason}
	}
	return nil
}

var _ idemdriver.EffectStore = (*Store)(nil)
