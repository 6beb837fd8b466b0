package inventory

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/httpmw"
)

// Hold is units of a SKU held for a buyer who has not paid yet: they are
// nobody else's until the hold is paid (an order), released, or runs out
// at Expires, when they are for sale again.
type Hold struct {
	HoldID  string    `json:"hold_id"`
	SKU     string    `json:"sku"`
	Qty     int64     `json:"qty"`
	User    string    `json:"user"`
	Expires time.Time `json:"expires"`
}

// Limits of a hold's time.
const (
	DefaultHoldTTL = 5 * time.Minute
	MaxHoldTTL     = time.Hour
)

// HoldID derives the ID of a hold of sku from its idempotency record's
// stored key, as OrderID does an order's: "h-<20 hex digits>-<sku>".
func HoldID(storedKey, sku string) string {
	return "h" + strings.TrimPrefix(OrderID(storedKey, sku), "o")
}

// holdSKU returns the SKU a hold ID names.
func holdSKU(id string) (string, bool) {
	if !strings.HasPrefix(id, "h-") {
		return "", false
	}
	return SKUOf("o" + strings.TrimPrefix(id, "h"))
}

// paidOrderID is the ID of the order that pays hold id: one per hold,
// however often it is paid.
func paidOrderID(holdID, sku string) string { return OrderID("paid:"+holdID, sku) }

// placeHold holds qty of sku for user for ttl, once per idempotency key.
func (s *Service) placeHold(ctx context.Context, sku string, qty int64, user string, ttl time.Duration) (Hold, error) {
	if err := CheckOrder(sku, qty, user); err != nil {
		return Hold{}, err
	}
	if ttl < time.Second || ttl > MaxHoldTTL {
		return Hold{}, errors.Join(ErrInvalid, errors.New("a hold lasts 1 s to 1 h"))
	}
	key, ok := idem.KeyFrom(ctx)
	if !ok {
		return Hold{}, errors.New("inventory: a hold runs under the idempotency middleware")
	}
	h := Hold{HoldID: HoldID(key, sku), SKU: sku, Qty: qty, User: user}
	var err error
	h.Expires, err = s.backend.Hold(ctx, sku, h.HoldID, qty, ttl)
	h.Expires = h.Expires.UTC().Truncate(time.Millisecond)
	return h, err
}

// payHold sells what hold id holds: its order, committed with the pay
// request's record. A hold paid twice (two requests, two keys) is one
// order.
func (s *Service) payHold(ctx context.Context, id, user string, commit func(any) error) (Order, error) {
	sku, ok := holdSKU(id)
	if !ok {
		return Order{}, ErrUnknownHold
	}
	if err := checkName("user", user); err != nil {
		return Order{}, err
	}
	qty, err := s.backend.ConfirmHold(ctx, sku, id)
	if err != nil {
		return Order{}, err
	}
	o := Order{OrderID: paidOrderID(id, sku), SKU: sku, Qty: qty, User: user, Trace: traceOf(ctx)}
	o.Fence, _ = idem.FenceFrom(ctx)
	if prev, err := s.backend.Order(ctx, o.OrderID); err == nil {
		return prev, nil // paid before
	}
	effect, err := s.backend.Record(ctx, o)
	if err == nil && effect != nil {
		err = commit(effect)
	}
	if err != nil {
		return Order{}, err
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return o, nil
}

func (s *Service) httpPostHold(w http.ResponseWriter, r *http.Request) {
	var body struct {
		SKU   string `json:"sku"`
		Qty   int64  `json:"qty"`
		User  string `json:"user"`
		TTLMs int64  `json:"ttl_ms"`
	}
	if err := decode(w, r, &body); err != nil {
		return
	}
	ttl := DefaultHoldTTL
	if body.TTLMs != 0 {
		ttl = time.Duration(body.TTLMs) * time.Millisecond
	}
	h, err := s.placeHold(r.Context(), body.SKU, body.Qty, body.User, ttl)
	if err != nil {
		if errors.Is(err, ErrSoldOut) {
			httpmw.Final(w) // a business answer, stored and replayed
		}
		httpError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, h)
}

func (s *Service) httpPayHold(w http.ResponseWriter, r *http.Request) {
	var body struct {
		User string `json:"user"`
	}
	if err := decode(w, r, &body); err != nil {
		return
	}
	o, err := s.payHold(r.Context(), chi.URLParam(r, "id"), body.User, func(effect any) error { return httpmw.Commit(w, effect) })
	if err != nil {
		if errors.Is(err, ErrHoldExpired) || errors.Is(err, ErrUnknownHold) {
			httpmw.Final(w)
		}
		httpError(w, err)
		return
	}
	w.Header().Set("Location", "/v1/orders/"+o.OrderID)
	o.Trace = nil
	writeJSON(w, http.StatusCreated, o)
}

func (s *Service) httpDeleteHold(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	sku, ok := holdSKU(id)
	if !ok {
		httpError(w, ErrUnknownHold)
		return
	}
	if err := s.backend.ReleaseHold(r.Context(), sku, id); err != nil {
		httpError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
