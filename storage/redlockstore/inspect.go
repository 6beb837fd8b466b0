package redlockstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// inspectTimeout bounds how long an operator's request waits for one node:
// longer than a lock round's node timeout, since nothing is held meanwhile.
const inspectTimeout = 2 * time.Second

// onEveryNode runs fn on every node at once and returns each node's answer
// or error, by node index. It needs a majority of answers: fewer is a
// *QuorumError for op.
func onEveryNode[T any](ctx context.Context, s *Store, op, key string, fn func(context.Context, *node) (T, error)) ([]T, []bool, error) {
	timeout := max(s.nodeTimeout(time.Second), inspectTimeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	vals, ok := make([]T, len(s.nodes)), make([]bool, len(s.nodes))
	// go-redis may not give up on a paused node when ctx ends; the request
	// is then left to finish in the background.
	r := newRound(s, s.all(), func(_ context.Context, n *node) (T, error) { return fn(ctx, n) })
	_ = r.collect(ctx, timeout, func(a answer[T]) bool {
		if a.err == nil {
			vals[a.node], ok[a.node] = a.v, true
		}
		return false
	})
	if got := len(slices.DeleteFunc(slices.Clone(ok), func(b bool) bool { return !b })); got < s.quorum {
		for _, i := range s.all() {
			if !r.answered[i] {
				r.failed[i] = s.nodes[i].timeoutErr()
			}
		}
		return nil, nil, s.quorumError(op, key, got, r.failed)
	}
	return vals, ok, nil
}

// unreachable describes the nodes that did not answer, for Detail.
func (s *Store) unreachable(ok []bool) string {
	var names []string
	for i, answered := range ok {
		if !answered {
			names = append(names, s.nodes[i].name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return "; unreachable: " + strings.Join(names, ", ")
}

// InspectLock implements lockdriver.Inspector. The key is held when one token
// holds it on a majority of the nodes; TTL is the shortest of those nodes'
// and Waiters the longest queue. Fence is the highest fence among those
// nodes: at least the holder's, which is the highest among the majority
// it took (a node that answered its round late issued a later one). For a
// free key it is the highest fence a node kept. Detail says
// how many nodes agree and which did not answer. It needs a majority of
// the nodes to answer (else ErrNoQuorum).
func (s *Store) InspectLock(ctx context.Context, key string) (lockdriver.LockInfo, error) {
	info, _, err := s.inspectLock(ctx, key)
	return info, err
}

func (s *Store) inspectLock(ctx context.Context, key string) (lockdriver.LockInfo, string, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return lockdriver.LockInfo{}, "", err
	}
	states, ok, err := onEveryNode(ctx, s, "inspect", key, func(ctx context.Context, n *node) (rediskit.LockState, error) {
		return s.base.InspectLock(ctx, n.c, key)
	})
	if err != nil {
		return lockdriver.LockInfo{}, "", err
	}
	count := map[string]int{}
	info := lockdriver.LockInfo{Key: key}
	for i, st := range states {
		if ok[i] {
			count[st.Token]++
			info.Fence = max(info.Fence, st.Fence)
			info.Waiters = max(info.Waiters, st.Waiters)
		}
	}
	var top string
	for _, tok := range slices.Sorted(maps.Keys(count)) {
		if tok != "" && count[tok] > count[top] {
			top = tok
		}
	}
	switch {
	case top != "" && count[top] >= s.quorum:
		info.Held, info.Token, info.TTL, info.Fence = true, lockdriver.TokenPrefix(top), -1, 0
		for i, st := range states {
			if ok[i] && st.Token == top {
				li := st.Info(key)
				if info.TTL < 0 || (li.TTL >= 0 && li.TTL < info.TTL) {
					info.TTL = li.TTL
				}
				info.Fence = max(info.Fence, li.Fence)
				info.Owner, info.Holds = li.Owner, li.Holds
			}
		}
		info.Detail = fmt.Sprintf("held on %d of %d nodes", count[top], len(s.nodes))
	case top != "":
		info.Detail = fmt.Sprintf("token %s on %d of %d nodes: no majority, not held", lockdriver.TokenPrefix(top), count[top], len(s.nodes))
	default:
		info.Detail = fmt.Sprintf("free on %d of %d nodes", count[""], len(s.nodes))
	}
	info.Detail += s.unreachable(ok)
	return info, top, nil
}

// ForceRelease implements lockdriver.Inspector: every node that answers frees the
// key, whatever token it has. Held in the result is what InspectLock saw
// before.
func (s *Store) ForceRelease(ctx context.Context, key string) (lockdriver.LockInfo, error) {
	info, top, err := s.inspectLock(ctx, key)
	if err != nil {
		return info, err
	}
	toks, _, err := onEveryNode(ctx, s, "force release", key, func(ctx context.Context, n *node) (string, error) {
		return rediskit.ForceRelease(ctx, n.c, s.base.Keys, key, s.base.PubSub.ScriptArg())
	})
	if err != nil {
		return info, err
	}
	if !info.Held && top == "" && slices.ContainsFunc(toks, func(t string) bool { return t != "" }) {
		info.Detail += "; freed a minority's stale entries"
	}
	return info, nil
}

// InspectRecord implements idemdriver.Inspector, the way Begin reads the nodes:
// a completed record on any node wins; else a claim is in flight when one
// token holds a majority. Detail says how many nodes agree.
func (s *Store) InspectRecord(ctx context.Context, key string) (idemdriver.RecordInfo, error) {
	k, err := idemdriver.CheckKey(key)
	if err != nil {
		return idemdriver.RecordInfo{}, err
	}
	states, ok, err := onEveryNode(ctx, s, "inspect record", key, func(ctx context.Context, n *node) (rediskit.RecordState, error) {
		return rediskit.InspectRecord(ctx, n.c, s.base.Records, k)
	})
	if err != nil {
		return idemdriver.RecordInfo{}, err
	}
	now := time.Now()
	var (
		best     = -1
		count    = map[string]int{}
		corrupt  []string
		answered int
	)
	for i, st := range states {
		if !ok[i] {
			continue
		}
		answered++
		switch {
		case !st.Found:
		case st.Corrupt != "":
			corrupt = append(corrupt, s.nodes[i].name+": "+st.Corrupt)
		case st.State == idemdriver.Completed:
			if best < 0 || states[best].State != idemdriver.Completed {
				best = i
			}
			count["c"]++
		default:
			count[st.Token]++
			if best < 0 || (states[best].State != idemdriver.Completed && count[st.Token] > count[states[best].Token]) {
				best = i
			}
		}
	}
	info := idemdriver.RecordInfo{Key: key}
	if best >= 0 {
		info = states[best].Info(key, now)
		agree := count["c"]
		if info.State == idemdriver.InFlight {
			agree = count[states[best].Token]
			info.Fence = highestFence(states, ok, states[best].Token)
			if agree < s.quorum {
				info.Detail = "no majority: "
			}
		}
		info.Detail += fmt.Sprintf("on %d of %d nodes", agree, len(s.nodes))
	} else {
		info.Detail = fmt.Sprintf("absent on %d of %d nodes", answered-len(corrupt), len(s.nodes))
	}
	if len(corrupt) > 0 {
		info.Found = true
		info.Corrupt = strings.Join(corrupt, "; ")
	}
	info.Detail += s.unreachable(ok)
	return info, nil
}

// DeleteRecord implements idemdriver.Inspector: every node that answers deletes
// its copy; it needs a majority to answer.
func (s *Store) DeleteRecord(ctx context.Context, key string) (bool, error) {
	k, err := idemdriver.CheckKey(key)
	if err != nil {
		return false, err
	}
	deleted, _, err := onEveryNode(ctx, s, "delete record", key, func(ctx context.Context, n *node) (bool, error) {
		return rediskit.DeleteRecord(ctx, n.c, s.base.Records, k, s.base.PubSub.ScriptArg())
	})
	if err != nil {
		return false, err
	}
	return slices.Contains(deleted, true), nil
}

// highestFence is the highest fence among the nodes holding tok's claim:
// at least the claim's (see InspectLock).
func highestFence(states []rediskit.RecordState, ok []bool, tok string) uint64 {
	var top uint64
	for i, st := range states {
		if ok[i] && st.Token == tok {
			top = max(top, st.Fence)
		}
	}
	return top
}

// ListKeys implements idemdriver.Lister: the keys of the records on any node
// that answers, each once (a record on a minority of nodes is listed too;
// InspectRecord says whether a majority agrees).
func (s *Store) ListKeys(ctx context.Context, fn func(key string) bool) error {
	seen := map[string]bool{}
	var errs []error
	stopped := false
	for _, n := range s.nodes {
		if stopped {
			break
		}
		err := rediskit.ListRecordKeys(ctx, n.c, s.base.Records, func(key string) bool {
			if seen[key] {
				return true
			}
			seen[key] = true
			stopped = !fn(key)
			return !stopped
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.name, err))
		}
	}
	if len(errs) > len(s.nodes)/2 {
		return fmt.Errorf("redlockstore: list records: %w", errors.Join(errs...))
	}
	return nil
}
