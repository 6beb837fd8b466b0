package observe

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strconv"
	"strings"
)

// HashKey returns the first 16 hex digits of key's SHA-256: enough to tell
// keys apart in logs and to match a log line against a key an operator
// has, without writing the key (a user ID, an order number) to the log.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// RedactKey returns err's message with every occurrence of key (quoted, as
// oncekit's errors write it, or bare) replaced by "key:" and its HashKey,
// so that an error can be logged without the key it names.
func RedactKey(err error, key string) string {
	msg := err.Error()
	if key == "" {
		return msg
	}
	h := "key:" + HashKey(key)
	msg = strings.ReplaceAll(msg, strconv.Quote(key), h)
	return strings.ReplaceAll(msg, key, h)
}

// Logger returns an Observer that logs every ended operation and point
// event to l: failures (Error outcomes, lost leases and claims) at Warn,
// the rest at Debug. Keys are logged hashed (HashKey), never in clear,
// also inside error messages (RedactKey).
func Logger(l *slog.Logger) Observer {
	if l == nil {
		return nil
	}
	return logger{l}
}

type logger struct{ l *slog.Logger }

func (g logger) Start(ctx context.Context, _ Event) context.Context { return ctx }
func (g logger) End(ctx context.Context, ev Event)                  { g.log(ctx, ev) }
func (g logger) Record(ctx context.Context, ev Event)               { g.log(ctx, ev) }

func (g logger) log(ctx context.Context, ev Event) {
	level := slog.LevelDebug
	if ev.Outcome == Error || ev.Outcome == Lost || ev.Op == LockLost || ev.Op == IdemLost {
		level = slog.LevelWarn
	}
	if !g.l.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 9)
	attrs = append(attrs, slog.String("op", string(ev.Op)))
	if ev.Driver != "" {
		attrs = append(attrs, slog.String("driver", ev.Driver))
	}
	if ev.Key != "" {
		attrs = append(attrs, slog.String("key_hash", HashKey(ev.Key)))
	}
	if ev.Outcome != "" {
		attrs = append(attrs, slog.String("outcome", string(ev.Outcome)))
	}
	if ev.Route != "" {
		attrs = append(attrs, slog.String("route", ev.Route))
	}
	if ev.Fence != 0 {
		attrs = append(attrs, slog.Uint64("fence", ev.Fence))
	}
	if ev.Duration != 0 {
		attrs = append(attrs, slog.Duration("duration", ev.Duration))
	}
	if ev.Held != 0 {
		attrs = append(attrs, slog.Duration("held", ev.Held))
	}
	if ev.Err != nil {
		attrs = append(attrs, slog.String("error", RedactKey(ev.Err, ev.Key)))
	}
	g.l.LogAttrs(ctx, level, "oncekit", attrs...)
}
