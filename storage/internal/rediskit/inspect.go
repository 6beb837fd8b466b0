package rediskit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

var (
	//go:embed lua/inspect_lock.lua
	inspectLockLua string
	//go:embed lua/force_release.lua
	forceReleaseLua string
	//go:embed lua/inspect_record.lua
	inspectRecordLua string
	//go:embed lua/delete_record.lua
	deleteRecordLua string

	inspectLock   = redis.NewScript(headLua + fenceLua + inspectLockLua)
	forceRelease  = redis.NewScript(headLua + preludeLua + fenceLua + forceReleaseLua)
	inspectRecord = redis.NewScript(headLua + fenceLua + claimLua + inspectRecordLua)
	deleteRecord  = redis.NewScript(preludeLua + deleteRecordLua)
)

// LockState is one server's view of a lock (InspectLock), with the full
// token so that Redlock can compare nodes.
type LockState struct {
	Token   string // "" when free
	PTTL    time.Duration
	Fence   uint64 // the holder's: the owner's fence, else the counter
	Owner   string
	Holds   int
	Waiters int
}

// Info converts s to a lockdriver.LockInfo for key.
func (s LockState) Info(key string) lockdriver.LockInfo {
	li := lockdriver.LockInfo{Key: key, Held: s.Token != "", Token: lockdriver.TokenPrefix(s.Token), Owner: s.Owner,
		Holds: s.Holds, Fence: s.Fence, Waiters: s.Waiters}
	switch {
	case !li.Held:
		li.TTL = 0
	case s.PTTL < 0:
		li.TTL = -1
	default:
		li.TTL = s.PTTL
	}
	if li.Held && li.Holds == 0 {
		li.Holds = 1
	}
	return li
}

// InspectLock reads key's lock state in one script.
func InspectLock(ctx context.Context, c redis.Scripter, k Keys, key string) (LockState, error) {
	v, err := inspectLock.Run(ctx, c, []string{k.Lock(key), k.Owner(key), k.Queue(key)}).Slice()
	if err != nil {
		return LockState{}, err
	}
	bad := func() (LockState, error) { return LockState{}, fmt.Errorf("unexpected inspect script reply %v", v) }
	if len(v) != 7 {
		return bad()
	}
	var st LockState
	var ok1, ok2, ok3, ok4, ok5, ok6, ok7 bool
	var pttl, holds, waiters int64
	var fence, ofence string
	st.Token, ok1 = v[0].(string)
	pttl, ok2 = v[1].(int64)
	fence, ok3 = v[2].(string)
	st.Owner, ok4 = v[3].(string)
	holds, ok5 = v[4].(int64)
	ofence, ok6 = v[5].(string)
	waiters, ok7 = v[6].(int64)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7) {
		return bad()
	}
	if st.Owner != "" {
		fence = ofence
	}
	f, err := strconv.ParseUint(fence, 10, 64)
	if err != nil {
		return LockState{}, fmt.Errorf("fence counter %q: %w", fence, err)
	}
	st.Fence, st.Holds, st.Waiters = f, int(holds), int(waiters)
	if pttl >= 0 {
		st.PTTL = time.Duration(pttl) * time.Millisecond
	} else {
		st.PTTL = -1
	}
	return st, nil
}

// ForceRelease frees key whoever holds it and announces the release on
// channel; it returns the token that held it ("" when free).
func ForceRelease(ctx context.Context, c redis.Scripter, k Keys, key, mode string) (string, error) {
	return forceRelease.Run(ctx, c, []string{k.Lock(key), k.Owner(key), k.Queue(key)}, k.Channel(key), mode).Text()
}

// RecordState is one server's view of an idempotency record.
type RecordState struct {
	Found   bool
	State   idemdriver.State
	FP      string
	Token   string // full, for Redlock to compare nodes
	Fence   uint64
	PTTL    time.Duration
	Stored  []byte
	Corrupt string // why the record is not one of ours, if it is not
}

// Info converts s to an idemdriver.RecordInfo for key, with Expires counted from
// now.
func (s RecordState) Info(key string, now time.Time) idemdriver.RecordInfo {
	ri := idemdriver.RecordInfo{Key: key, Found: s.Found, State: s.State, Fingerprint: s.FP,
		Token: lockdriver.TokenPrefix(s.Token), Fence: s.Fence, Stored: s.Stored, Corrupt: s.Corrupt}
	if s.Found && s.PTTL >= 0 {
		ri.Expires = now.Add(s.PTTL)
	}
	return ri
}

// InspectRecord reads key's record. A record that is not one of ours is
// reported with Corrupt set, not as an error, so that an operator can see
// and delete it.
func InspectRecord(ctx context.Context, c redis.Scripter, r Records, key idemdriver.Key) (RecordState, error) {
	v, err := inspectRecord.Run(ctx, c, []string{r.Record(key)}).Slice()
	if err != nil {
		return RecordState{}, err
	}
	bad := func() (RecordState, error) { return RecordState{}, fmt.Errorf("unexpected inspect script reply %v", v) }
	if len(v) == 0 {
		return bad()
	}
	pttlOf := func(x any) (time.Duration, bool) {
		ms, ok := x.(int64)
		if ms < 0 {
			return -1, ok
		}
		return time.Duration(ms) * time.Millisecond, ok
	}
	switch kind, _ := v[0].(string); {
	case kind == "none" && len(v) == 1:
		return RecordState{}, nil
	case kind == "other" && len(v) == 2:
		return RecordState{Found: true, Corrupt: fmt.Sprintf("a %v, not a record", v[1])}, nil
	case kind == "corrupt" && len(v) == 3:
		pttl, ok := pttlOf(v[1])
		if !ok {
			return bad()
		}
		return RecordState{Found: true, PTTL: pttl, Corrupt: fmt.Sprintf("not a record: %q", v[2])}, nil
	case kind == "layout" && len(v) == 3:
		pttl, ok := pttlOf(v[1])
		if !ok {
			return bad()
		}
		return RecordState{Found: true, PTTL: pttl, Corrupt: fmt.Sprintf("a record of layout %v, which this version does not read (left alone until it expires)", v[2])}, nil
	case kind != "record" || len(v) != 7:
		return bad()
	}
	pttl, ok := pttlOf(v[1])
	f := make([]string, 5)
	for i := range f {
		s, ok2 := v[2+i].(string)
		ok = ok && ok2
		f[i] = s
	}
	if !ok {
		return bad()
	}
	st := RecordState{Found: true, FP: f[1], Token: f[2], PTTL: pttl}
	if st.Fence, err = strconv.ParseUint(f[3], 10, 64); err != nil {
		st.Corrupt = fmt.Sprintf("fence %q", f[3])
	}
	switch f[0] {
	case "i":
		st.State = idemdriver.InFlight
	case "c":
		st.State, st.Stored = idemdriver.Completed, []byte(f[4])
	default:
		st.Corrupt = fmt.Sprintf("record state %q", f[0])
	}
	return st, nil
}

// DeleteRecord deletes key's record and announces it on its channel.
func DeleteRecord(ctx context.Context, c redis.Scripter, r Records, key idemdriver.Key, mode string) (bool, error) {
	n, err := deleteRecord.Run(ctx, c, []string{r.Record(key)}, r.Channel(key), mode).Int64()
	return n == 1, err
}

// ListRecordKeys calls fn with the key of every record named under r on c
// (a *redis.ClusterClient: on every primary), scanning in pages of 1000,
// until fn returns false.
func ListRecordKeys(ctx context.Context, c any, r Records, fn func(key string) bool) error {
	match := globEscape(r.Prefix) + "{*"
	stopped := false
	scan := func(ctx context.Context, sc scanner) error {
		var cursor uint64
		for !stopped {
			names, next, err := sc.Scan(ctx, cursor, match, 1000).Result()
			if err != nil {
				return err
			}
			live, err := recordsAlive(ctx, sc, names)
			if err != nil {
				return err
			}
			for i, name := range names {
				if !live[i] {
					continue
				}
				if key, ok := r.KeyOf(name); ok && !fn(key) {
					stopped = true
					return nil
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
		return nil
	}
	switch c := c.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex // fn is called from one primary at a time
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(ctx, n)
		})
	case scanner:
		return scan(ctx, c)
	}
	return fmt.Errorf("cannot list keys through a %T (it has no SCAN)", c)
}

// scanner is a client ListRecordKeys can walk.
type scanner interface {
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// recordsAlive reads, in one round trip, which of names hold something
// InspectRecord would report: not an abandoned claim's tombstone, nor an
// in-flight claim past its lease — both kept only to count the next
// claim's attempt (see lua/claim.lua), for idem.AttemptMemory. Anything
// else (a record, a corrupt value, a key of another type) is listed, and
// every name when c cannot pipeline (every redis.UniversalClient, and a
// Cluster's node, can).
func recordsAlive(ctx context.Context, c scanner, names []string) ([]bool, error) {
	live := make([]bool, len(names))
	pc, ok := c.(interface{ Pipeline() redis.Pipeliner })
	if !ok {
		for i := range live {
			live[i] = true
		}
		return live, nil
	}
	if len(names) == 0 {
		return live, nil
	}
	p := pc.Pipeline()
	heads := make([]*redis.StringCmd, len(names))
	pttls := make([]*redis.DurationCmd, len(names))
	for i, name := range names {
		heads[i] = p.GetRange(ctx, name, 0, 4)
		pttls[i] = p.PTTL(ctx, name)
	}
	if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) && !IsReply(err) {
		return nil, err
	}
	for i := range names {
		head, err := heads[i].Result()
		switch {
		case err != nil: // not a string (a reply error): not ours, listed
			live[i] = true
		case head == "R2|x|":
			live[i] = false
		case head == "R2|i|":
			live[i] = pttls[i].Val() < 0 || pttls[i].Val() > idem.AttemptMemory
		default:
			live[i] = head != "" // "": the key went meanwhile
		}
	}
	return live, nil
}

// globEscape escapes the characters SCAN's MATCH pattern treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
