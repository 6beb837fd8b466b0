package inventory

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Item is a SKU's stock (the units left to sell), how much of it was
// sold, and how much is held by buyers who have not paid yet.
type Item struct {
	SKU   string `json:"sku"`
	Stock int64  `json:"stock"`
	Sold  int64  `json:"sold"`
	Held  int64  `json:"held,omitempty"`
}

// Order is one sale.
type Order struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int64  `json:"qty"`
	User    string `json:"user"`
	// Fence is the SKU lock's fence the sale was made under.
	Fence uint64 `json:"fence"`
	// Trace is the trace context of the request that placed the order
	// (the OpenTelemetry propagator's fields, W3C traceparent by
	// default), kept with the order in the outbox so that its
	// order.created message, relayed later, continues the request's
	// trace. Not part of the API's answers.
	Trace map[string]string `json:"trace,omitempty"`
}

// Errors of the inventory.
var (
	ErrUnknownSKU   = errors.New("inventory: unknown sku")
	ErrUnknownOrder = errors.New("inventory: unknown order")
	ErrSoldOut      = errors.New("inventory: not enough stock")
	// ErrHoldExpired: a hold was confirmed after it ran out; its units
	// are free again and nothing was sold.
	ErrHoldExpired = errors.New("inventory: hold expired")
	// ErrHoldPaid: a release of a hold that was paid; nothing changed.
	ErrHoldPaid = errors.New("inventory: hold already paid")
	// ErrUnknownHold: no such hold (never made, released, or forgotten).
	ErrUnknownHold = errors.New("inventory: unknown hold")
	// ErrInvalid is bad input (the message says which).
	ErrInvalid = errors.New("inventory: invalid input")
)

// Limits of the input.
const (
	MaxNameLen = 64
	MaxQty     = 1000
	MaxStock   = 1_000_000_000
)

// checkName validates a SKU or a user: 1 to 64 bytes of letters, digits,
// '-', '_' and '.'.
func checkName(what, s string) error {
	if s == "" || len(s) > MaxNameLen {
		return fmt.Errorf("%w: %s must be 1 to %d bytes", ErrInvalid, what, MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("%w: %s may hold only letters, digits, '-', '_' and '.'", ErrInvalid, what)
		}
	}
	return nil
}

// CheckSKU validates a SKU.
func CheckSKU(sku string) error { return checkName("sku", sku) }

// CheckOrder validates an order request.
func CheckOrder(sku string, qty int64, user string) error {
	if err := checkName("sku", sku); err != nil {
		return err
	}
	if err := checkName("user", user); err != nil {
		return err
	}
	if qty < 1 || qty > MaxQty {
		return fmt.Errorf("%w: qty must be 1 to %d", ErrInvalid, MaxQty)
	}
	return nil
}

// CheckStock validates a stock level.
func CheckStock(stock int64) error {
	if stock < 0 || stock > MaxStock {
		return fmt.Errorf("%w: stock must be 0 to %d", ErrInvalid, MaxStock)
	}
	return nil
}

// OrderID derives the ID of an order of sku from its idempotency
// record's stored key (idem.KeyFrom): every run for one key — a retry
// after a replica died mid-sale — names the same order. The ID is
// "o-<20 hex digits>-<sku>": it names its SKU (SKUOf), so that a store
// that keeps each SKU's orders together (Redis Cluster: one hash slot per
// SKU) finds an order by its ID.
func OrderID(storedKey, sku string) string {
	h := sha256.Sum256([]byte(storedKey))
	return "o-" + hex.EncodeToString(h[:10]) + "-" + sku
}

// SKUOf returns the SKU an order ID (OrderID) names.
func SKUOf(orderID string) (string, bool) {
	const n = len("o-") + 20 + len("-")
	if len(orderID) <= n || !strings.HasPrefix(orderID, "o-") || orderID[n-1] != '-' || CheckSKU(orderID[n:]) != nil {
		return "", false
	}
	return orderID[n:], true
}

func orderIDs(orders []Order) []string {
	ids := make([]string, len(orders))
	for i, o := range orders {
		ids[i] = o.OrderID
	}
	return ids
}

// Backend keeps the inventory where every replica sees it: the stock of
// each SKU (package stock, through Stocked, which every Backend embeds),
// the orders, the outbox of order.created events and the shipments. Record
// and Ship either return an effect — a write that the caller commits
// atomically with the idempotency record (httpmw.Commit, idem.Commit) —
// or, when the inventory does not live with the records (Redlock), make
// the write themselves keyed on the order's ID, refusing a second one, and
// return a nil effect.
type Backend interface {
	// PutItem makes sku's stock (its free units) stock.
	PutItem(ctx context.Context, sku string, stock int64) (Item, error)
	Item(ctx context.Context, sku string) (Item, error)
	// Take takes o.Qty units of o.SKU for the order, once per order ID
	// (a retry of a sale takes nothing more): ErrSoldOut, ErrUnknownSKU.
	Take(ctx context.Context, o Order) error
	// Hold holds qty units of sku for the hold id until ttl has passed:
	// ErrSoldOut, ErrUnknownSKU. ConfirmHold sells them (ErrHoldExpired
	// when the hold ran out first), ReleaseHold gives them back.
	Hold(ctx context.Context, sku, id string, qty int64, ttl time.Duration) (time.Time, error)
	ConfirmHold(ctx context.Context, sku, id string) (qty int64, err error)
	ReleaseHold(ctx context.Context, sku, id string) error
	Order(ctx context.Context, id string) (Order, error)
	// Record records the sold order o and its order.created event: the
	// effect that does, or nil once done (Redlock).
	Record(ctx context.Context, o Order) (effect any, err error)
	// Outbox returns up to n orders whose order.created event is not
	// published yet; Published removes them.
	Outbox(ctx context.Context, n int) ([]Order, error)
	Published(ctx context.Context, orders []Order) error
	// Ship records order o's shipment, or returns the effect that does.
	Ship(ctx context.Context, o Order) (effect any, err error)
	// Counts returns how many orders and shipments there are.
	Counts(ctx context.Context) (orders, shipments int64, err error)
}
