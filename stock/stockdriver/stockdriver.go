package stockdriver

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrUnknownLayout is a driver's error for an item or a record stored in a
// layout this version does not read (a later version's): the call changes
// nothing.
var ErrUnknownLayout = errors.New("stock: stored in a layout this version does not read")

// Store keeps stock. Apply applies ops to item atomically and in order,
// after ending every hold of the item whose time has run out (their units
// are free again, their records Expired), and answers each op with a
// Result, in order, and the item's Level after them all.
//
// Only a store failure is an error: an op the rules refuse (sold out, an
// unknown hold) is its Result's State. An item that was never put answers
// every op but Add and Set with State NoItem and writes nothing.
type Store interface {
	ApplyStock(ctx context.Context, item string, ops []Op) (Answer, error)
}

// Kind is what an Op does.
type Kind uint8

// The kinds of Op.
const (
	// Take takes Units free units for Key and sells them at once.
	Take Kind = 1 + iota
	// Hold holds Units free units for Key until TTL has passed.
	Hold
	// Confirm sells the units Key holds.
	Confirm
	// Release frees the units Key holds.
	Release
	// Add adds Units (negative: withdraws) free units; what was put changes alike.
	Add
	// Set starts the item over: Units free, none sold, the live holds
	// kept (what was put is Units plus them).
	Set
)

func (k Kind) String() string {
	switch k {
	case Take:
		return "take"
	case Hold:
		return "hold"
	case Confirm:
		return "confirm"
	case Release:
		return "release"
	case Add:
		return "add"
	case Set:
		return "set"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Op is one operation on an item.
type Op struct {
	Kind Kind
	// Key names the take or the hold (Take, Hold, Confirm, Release): one
	// answer per key, the first, for as long as the record is kept.
	Key string
	// Units is how many units a Take or Hold wants, or an Add adds; what
	// Set makes free.
	Units int64
	// TTL is how long a Hold keeps its units.
	TTL time.Duration
	// Keep is how long a Take's or Hold's record is kept, from the take or
	// from the hold's end.
	Keep time.Duration
}

// State is a key's record, and an op's answer.
type State uint8

// The states.
const (
	// None: the key has no record (a Confirm or Release of a key never held).
	None State = iota
	// Sold: the units are sold, by a Take or a confirmed Hold.
	Sold
	// Held: the units are held until the record's Deadline.
	Held
	// SoldOut: fewer units were free than the key wanted; nothing was taken.
	SoldOut
	// Released: the hold was given back before its end.
	Released
	// Expired: the hold ran out before it was confirmed; its units are free.
	Expired
	// NoItem: the item was never put.
	NoItem
	// Mismatch: the key's record was made by another kind of op or for
	// another number of units; nothing changed.
	Mismatch
)

func (s State) String() string {
	switch s {
	case None:
		return "none"
	case Sold:
		return "sold"
	case Held:
		return "held"
	case SoldOut:
		return "sold_out"
	case Released:
		return "released"
	case Expired:
		return "expired"
	case NoItem:
		return "no_item"
	case Mismatch:
		return "mismatch"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Result answers one Op.
type Result struct {
	State State
	// Units is the units the key took, holds, held or wanted.
	Units int64
	// Remaining is how long a Held answer's hold still lasts, by the
	// store's clock.
	Remaining time.Duration
	// Replayed is true when the answer is the key's earlier one: the op
	// changed nothing.
	Replayed bool
}

// Level is an item's units: what was put, and how much of it is free,
// held and sold. Free + Held + Sold == Put, always.
type Level struct {
	Put, Free, Held, Sold int64
}

// Answer is Apply's answer for a batch.
type Answer struct {
	Results []Result
	// Exists is false for an item never put.
	Exists bool
	Level  Level
	// Expired is how many holds ran out in this call (their units freed).
	Expired int
}

// Record is a key's record, as Apply reads and changes it. Times are
// milliseconds on the store's clock.
type Record struct {
	Key string
	// Kind is the op that made the record: Take or Hold.
	Kind  Kind
	State State
	Units int64
	// Deadline is when a hold ends (Held, and kept after it).
	Deadline int64
	// Until is when the record may be forgotten; a Held record is kept
	// until its hold has ended, whatever Until says.
	Until int64
	// Keep is how long the record is kept after its hold ends (Op.Keep, in
	// ms): ending it sets Until to at least the end plus Keep.
	Keep int64
	// Changed is set by Apply when the record is new or changed: the
	// driver writes it.
	Changed bool
}

// Item is an item's state as Apply reads and changes it.
type Item struct {
	Exists bool
	Level
	// Records holds the record of every key the ops name that has one, and
	// every Held record whose Deadline is at or before now (a driver may
	// include more). Apply adds the records it makes.
	Records map[string]*Record
}

// MaxUnits bounds the units of one op and of an item, well inside every
// store's integers (and Lua's doubles).
const MaxUnits = 1 << 50

// Check returns an error for an op no store should be given: its kind
// unknown, its units out of bounds, a hold without a TTL.
func Check(op Op) error {
	switch op.Kind {
	case Take, Hold:
		if op.Units < 1 || op.Units > MaxUnits {
			return fmt.Errorf("%s of %d units: must be 1 to %d", op.Kind, op.Units, int64(MaxUnits))
		}
		if op.Kind == Hold && op.TTL < time.Millisecond {
			return fmt.Errorf("hold for %v: at least 1ms", op.TTL)
		}
	case Confirm, Release:
	case Add:
		if op.Units < -MaxUnits || op.Units > MaxUnits {
			return fmt.Errorf("add of %d units: out of bounds", op.Units)
		}
	case Set:
		if op.Units < 0 || op.Units > MaxUnits {
			return fmt.Errorf("set to %d units: must be 0 to %d", op.Units, int64(MaxUnits))
		}
	default:
		return fmt.Errorf("unknown op kind %d", op.Kind)
	}
	return nil
}

// Apply applies ops to it at now (milliseconds on the store's clock):
// first it ends the holds that ran out, then it runs each op in turn. It
// changes it and its records in place, marking each record it wrote
// Changed, and returns the answer. The ops must have passed Check.
func Apply(now int64, it *Item, ops []Op) Answer {
	if it.Records == nil {
		it.Records = make(map[string]*Record)
	}
	a := Answer{Results: make([]Result, len(ops))}
	if it.Exists {
		for _, r := range it.Records {
			if r.State == Held && r.Deadline <= now {
				it.Held -= r.Units
				it.Free += r.Units
				r.end(now, Expired)
				a.Expired++
			}
		}
	}
	for i, op := range ops {
		a.Results[i] = apply(now, it, op)
	}
	a.Level, a.Exists = it.Level, it.Exists
	return a
}

func apply(now int64, it *Item, op Op) Result {
	switch op.Kind {
	case Add, Set:
		return adjust(it, op)
	}
	if !it.Exists {
		return Result{State: NoItem, Units: op.Units}
	}
	r := it.Records[op.Key]
	switch op.Kind {
	case Take, Hold:
		if r != nil {
			return replay(now, r, op)
		}
		r = &Record{Key: op.Key, Kind: op.Kind, Units: op.Units, Changed: true}
		it.Records[op.Key] = r
		switch {
		case it.Free < op.Units:
			r.State, r.Until = SoldOut, now+op.Keep.Milliseconds()
			return Result{State: SoldOut, Units: op.Units}
		case op.Kind == Take:
			it.Free -= op.Units
			it.Sold += op.Units
			r.State, r.Until = Sold, now+op.Keep.Milliseconds()
			return Result{State: Sold, Units: op.Units}
		default:
			it.Free -= op.Units
			it.Held += op.Units
			r.State, r.Deadline, r.Keep = Held, now+op.TTL.Milliseconds(), op.Keep.Milliseconds()
			r.Until = r.Deadline + r.Keep
			return Result{State: Held, Units: op.Units, Remaining: op.TTL}
		}
	case Confirm, Release:
		if r == nil {
			return Result{State: None}
		}
		if r.Kind != Hold {
			return Result{State: Mismatch, Units: r.Units}
		}
		if r.State != Held {
			return replay(now, r, op)
		}
		it.Held -= r.Units
		if op.Kind == Confirm {
			it.Sold += r.Units
			r.end(now, Sold)
		} else {
			it.Free += r.Units
			r.end(now, Released)
		}
		return Result{State: r.State, Units: r.Units}
	}
	return Result{State: Mismatch}
}

// end ends the hold of r at now in state st.
func (r *Record) end(now int64, st State) {
	r.State, r.Until, r.Changed = st, max(r.Until, now+r.Keep), true
}

// replay answers op from the key's record r, changing nothing.
func replay(now int64, r *Record, op Op) Result {
	if (op.Kind == Take || op.Kind == Hold) && (r.Kind != op.Kind || r.Units != op.Units) {
		return Result{State: Mismatch, Units: r.Units}
	}
	res := Result{State: r.State, Units: r.Units, Replayed: true}
	if r.State == Held {
		res.Remaining = time.Duration(r.Deadline-now) * time.Millisecond
	}
	return res
}

// adjust applies an Add or a Set: it answers None when done, and SoldOut,
// changing nothing, for a withdrawal of more than is free.
func adjust(it *Item, op Op) Result {
	if op.Kind == Set {
		it.Exists = true
		it.Free, it.Sold, it.Put = op.Units, 0, op.Units+it.Held
		return Result{State: None, Units: op.Units}
	}
	if it.Free+op.Units < 0 || it.Put+op.Units > MaxUnits {
		return Result{State: SoldOut, Units: op.Units}
	}
	it.Exists = true
	it.Free += op.Units
	it.Put += op.Units
	return Result{State: None, Units: op.Units}
}
