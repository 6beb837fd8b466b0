package rediskit

import (
	"fmt"

	"github.com/redis/go-redis/v9"
)

// AcquireCode is the acquire script's verdict (lua/acquire.lua).
type AcquireCode int64

const (
	// AcquireLate: the request reached the server after the caller's
	// deadline and took nothing.
	AcquireLate AcquireCode = -1
	// AcquireBusy: another token holds the key; N is its PTTL in ms and
	// Floor the highest fence the key's counter had issued or reserved.
	AcquireBusy AcquireCode = 0
	// AcquireTaken: the key is ours; N is the hold's first fence, Fences
	// how many it has (N … N + Fences − 1; 0 unfenced), Clock the server's
	// clock in µs when they were issued (0 unfenced).
	AcquireTaken AcquireCode = 1
	// AcquireReentered: the owner holds the key and one more hold is
	// counted; N is the owner's fence, Token the owner's token.
	AcquireReentered AcquireCode = 2
)

// AcquireReply is the acquire script's answer.
type AcquireReply struct {
	Code  AcquireCode
	N     int64
	Token string
	Floor uint64 // AcquireBusy: every fence issued before the reply is at most Floor
	Clock int64  // AcquireTaken: the server's clock in µs
	// Fences is, for AcquireTaken, how many fences the hold has, from N
	// (at least 1 when fenced; see lua/fence.lua).
	Fences uint64
	// Plain: taken by a first attempt's short script (lua/acquire_new.lua),
	// which takes only a key without flags: its release may try the short
	// one too (Base.Release).
	Plain bool
	// Crowded: AcquireBusy from a first attempt (lua/acquire_new.lua), and
	// processes wait in the key's queue: the key is taken in turns.
	Crowded bool
}

// undecided reports the reply of AcquireNew or ReleaseNew that leaves the
// decision to the full script: -2, alone or in a one-element array.
func undecided(cmd *redis.Cmd) bool {
	switch v := valueOf(cmd).Val().(type) {
	case int64:
		return v == -2
	case []any:
		return len(v) == 1 && v[0] == int64(-2)
	}
	return false
}

// ParseAcquire reads the acquire script's reply.
func ParseAcquire(cmd *redis.Cmd) (AcquireReply, error) {
	v, err := cmd.Slice()
	if err != nil {
		return AcquireReply{}, err
	}
	var (
		r    AcquireReply
		code int64
	)
	ok := len(v) >= 2
	if ok {
		code, ok = v[0].(int64)
		r.Code = AcquireCode(code)
	}
	if ok {
		r.N, ok = v[1].(int64)
	}
	if ok && r.Code == AcquireTaken && len(v) >= 3 {
		r.Clock, ok = v[2].(int64)
	}
	if ok && r.Code == AcquireTaken {
		r.Fences = 1
		if len(v) >= 4 {
			var n int64
			n, ok = v[3].(int64)
			r.Fences = uint64(max(n, 1))
		}
	}
	if ok && r.Code == AcquireBusy && (len(v) == 3 || len(v) == 4) {
		var floor int64
		floor, ok = v[2].(int64)
		r.Floor = uint64(max(floor, 0))
		if ok && len(v) == 4 {
			var queued int64
			queued, ok = v[3].(int64)
			r.Crowded = queued == 1
		}
	}
	if ok && r.Code == AcquireReentered {
		ok = len(v) == 3
		if ok {
			r.Token, ok = v[2].(string)
		}
	}
	if ok && (r.Code < AcquireLate || r.Code > AcquireReentered) {
		ok = false
	}
	if !ok {
		return AcquireReply{}, fmt.Errorf("unexpected acquire script reply %v", v)
	}
	return r, nil
}

// ReleaseCode is the release script's verdict (lua/release.lua).
type ReleaseCode int64

const (
	// ReleaseNotOurs: the key was not held by the token.
	ReleaseNotOurs ReleaseCode = 0
	// ReleaseFreed: the key was let go and the release announced.
	ReleaseFreed ReleaseCode = 1
	// ReleaseHoldReturned: one of an owner's holds was given back; the
	// owner still holds the key.
	ReleaseHoldReturned ReleaseCode = 2
)

// Ours reports whether the token held the key.
func (c ReleaseCode) Ours() bool { return c == ReleaseFreed || c == ReleaseHoldReturned }

// ParseRelease reads the release script's reply.
func ParseRelease(cmd *redis.Cmd) (ReleaseCode, error) {
	v, err := cmd.Int64()
	if err != nil {
		return 0, err
	}
	if c := ReleaseCode(v); c >= ReleaseNotOurs && c <= ReleaseHoldReturned {
		return c, nil
	}
	return 0, fmt.Errorf("unexpected release script reply %d", v)
}

// TransferCode is the transfer script's verdict (lua/transfer.lua).
type TransferCode int64

const (
	// TransferNotOurs: the current token no longer held the key.
	TransferNotOurs TransferCode = 0
	// TransferDone: the key now holds the next token, with a new hold's
	// fences.
	TransferDone TransferCode = 1
	// TransferHoldReturned: one of an owner's holds was given back and
	// others remain; nothing was handed on.
	TransferHoldReturned TransferCode = 2
)

// ParseTransfer reads the transfer script's reply: its code and, for
// TransferDone, the new hold's first fence and how many it has.
func ParseTransfer(cmd *redis.Cmd) (TransferCode, uint64, uint64, error) {
	v, err := cmd.Int64Slice()
	if err != nil {
		return 0, 0, 0, err
	}
	ok := len(v) >= 2 && v[0] >= int64(TransferNotOurs) && v[0] <= int64(TransferHoldReturned) && v[1] >= 0
	if ok && TransferCode(v[0]) == TransferDone {
		ok = len(v) == 3 && v[2] >= 1
	}
	if !ok {
		return 0, 0, 0, fmt.Errorf("unexpected transfer script reply %v", v)
	}
	if TransferCode(v[0]) != TransferDone {
		return TransferCode(v[0]), 0, 0, nil
	}
	return TransferDone, uint64(v[1]), uint64(v[2]), nil
}

// ParseFlag reads the reply of the scripts that answer 1 (done: extended,
// written back, finished) or 0 (the token no longer holds the key).
func ParseFlag(cmd *redis.Cmd) (bool, error) {
	v, err := cmd.Int64()
	if err != nil {
		return false, err
	}
	if v != 0 && v != 1 {
		return false, fmt.Errorf("unexpected script reply %d", v)
	}
	return v == 1, nil
}

// BeginCode is the idem_begin script's verdict (lua/idem_begin.lua).
type BeginCode int64

const (
	// BeginCorrupt: something else lives under the record's name; Reason
	// says what.
	BeginCorrupt BeginCode = -2
	// BeginUnknownLayout: a record of a layout this version does not
	// read (an earlier or a later version's); Reason is its layout tag.
	// It is never taken over.
	BeginUnknownLayout BeginCode = -3
	// BeginClaimed: the key is claimed for the token; N is the fence, Clock
	// the server's clock in µs when it was issued, Attempt the claim's.
	BeginClaimed BeginCode = 1
	// BeginInFlight: another claim runs; N is its lease left, in ms.
	BeginInFlight BeginCode = 2
	// BeginCompleted: the record is completed; N is its PTTL, Result the
	// stored result.
	BeginCompleted BeginCode = 3
	// BeginMismatch: the record has another fingerprint; N is its PTTL.
	BeginMismatch BeginCode = 4
)

// BeginReply is the idem_begin script's answer.
type BeginReply struct {
	Code   BeginCode
	N      int64
	Result []byte
	Reason string
	Clock  int64
	// Attempt is a claimed record's idemdriver.Claim.Attempt.
	Attempt int64
}

// ParseBegin reads the idem_begin script's reply.
func ParseBegin(cmd *redis.Cmd) (BeginReply, error) {
	v, err := cmd.Slice()
	if err != nil {
		return BeginReply{}, err
	}
	var (
		r    BeginReply
		code int64
	)
	ok := len(v) >= 2
	if ok {
		code, ok = v[0].(int64)
		r.Code = BeginCode(code)
	}
	switch {
	case !ok:
	case r.Code == BeginCorrupt || r.Code == BeginUnknownLayout:
		r.Reason, ok = v[1].(string)
	case r.Code == BeginCompleted:
		var res string
		r.N, ok = v[1].(int64)
		if ok && len(v) == 3 {
			res, ok = v[2].(string)
			r.Result = []byte(res)
		} else {
			ok = false
		}
	case r.Code == BeginClaimed:
		r.N, ok = v[1].(int64)
		if ok && len(v) >= 3 {
			r.Clock, ok = v[2].(int64)
		}
		r.Attempt = 1
		if ok && len(v) >= 4 {
			r.Attempt, ok = v[3].(int64)
		}
	case r.Code == BeginInFlight || r.Code == BeginMismatch:
		r.N, ok = v[1].(int64)
	default:
		ok = false
	}
	if !ok {
		return BeginReply{}, fmt.Errorf("unexpected begin script reply %v", v)
	}
	return r, nil
}

// FinishOp is what the idem_finish script does to an in-flight claim.
type FinishOp string

const (
	// Complete stores the result and keeps the record for the retention.
	Complete FinishOp = "complete"
	// Abandon frees the record (a tombstone keeps its fence and attempt
	// number) so that a retry can run.
	Abandon FinishOp = "abandon"
	// GiveBack frees the record of a claim its caller will never use (its
	// Begin's answer came too late, or too few nodes agreed): unlike
	// Abandon, it does not count as an attempt.
	GiveBack FinishOp = "giveback"
	// Extend extends the claim's lease.
	Extend FinishOp = "extend"
)
