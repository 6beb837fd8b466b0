package stock

import (
	"errors"
	"fmt"

	"github.com/oncekit/oncekit/stock/stockdriver"
)

// ErrSoldOut: fewer units were free than a Take or Hold wanted, and
// nothing was taken. The error is a *SoldOutError.
var ErrSoldOut = errors.New("stock: sold out")

// ErrHoldExpired: the hold ran out before it was confirmed; its units are
// free again and nothing was sold.
var ErrHoldExpired = errors.New("stock: hold expired")

// ErrHoldReleased: the hold was released; nothing was sold.
var ErrHoldReleased = errors.New("stock: hold released")

// ErrNoHold: the key holds nothing on the item (never held, or its record
// is no longer kept).
var ErrNoHold = errors.New("stock: no such hold")

// ErrSold: a Release of a hold that was already confirmed; nothing changed.
var ErrSold = errors.New("stock: hold already confirmed")

// ErrUnknownItem: the item was never put.
var ErrUnknownItem = errors.New("stock: unknown item")

// ErrMismatch: the key was used before on the item for another kind of
// operation (a take against a hold) or another number of units; nothing
// changed.
var ErrMismatch = errors.New("stock: key reused for another operation")

// ErrInvalid: bad input — an empty or over-long item or key, units out of
// bounds, a hold without a TTL.
var ErrInvalid = errors.New("stock: invalid argument")

// ErrStore: the store failed or could not be reached; the operation may or
// may not have happened, and a retry with the same key gets its answer.
var ErrStore = errors.New("stock: store failed")

// ErrUnknownLayout: the item or a key's record was stored by a later
// version in a layout this one does not read; nothing changed. It comes
// with ErrStore.
var ErrUnknownLayout = stockdriver.ErrUnknownLayout

// SoldOutError is ErrSoldOut with its facts.
type SoldOutError struct {
	Item string
	// Units is how many units were wanted.
	Units int64
	// Free is how many units were free after the answer (for a replayed
	// answer: now).
	Free int64
	// Replayed is true when the answer is the key's earlier one.
	Replayed bool
}

func (e *SoldOutError) Error() string {
	return fmt.Sprintf("stock: %q sold out: %d wanted, %d free", e.Item, e.Units, e.Free)
}

// Unwrap returns ErrSoldOut.
func (e *SoldOutError) Unwrap() error { return ErrSoldOut }

func errAnswers(got, want int) error {
	return fmt.Errorf("%w: the store answered %d operations of %d", ErrStore, got, want)
}
