package zkstore

import (
	"errors"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oncekit/oncekit/core/observe"
)

// Option configures a Store.
type Option func(*options)

type options struct {
	root           string
	sessionTimeout time.Duration
	logger         zk.Logger
	cleanup        time.Duration
	observer       observe.Observer
}

func defaultOptions() options {
	return options{root: "/oncekit", sessionTimeout: 10 * time.Second}
}

// WithRoot sets the znode under which the Store keeps its locks
// ("<root>/lock") and records ("<root>/idem"). Default "/oncekit".
func WithRoot(path string) Option { return func(o *options) { o.root = path } }

// WithSessionTimeout sets the session timeout the Store asks for. It bounds
// how long the key of a holder that crashed or froze stays held, and how
// long a client cut off from the ensemble may go unnoticed by the servers.
// The servers keep it within 2 and 20 of their ticks (tickTime, 2 s by
// default: 4 s to 40 s). Default 10 s.
func WithSessionTimeout(d time.Duration) Option { return func(o *options) { o.sessionTimeout = d } }

// WithLogger sends the ZooKeeper client's log lines to l (StdLogger: the
// standard log package). Default: dropped.
func WithLogger(l zk.Logger) Option { return func(o *options) { o.logger = l } }

// WithObserver sets where the Store reports hand-offs (a waiter that got
// the key), and where the lock.Mutex and idem.Guard built on it report
// their operations (see package observe). Default: none.
func WithObserver(obs observe.Observer) Option { return func(o *options) { o.observer = obs } }

// WithCleanup deletes records whose retention (or in-flight lease) ended,
// every interval, in the background (see Store.Cleanup). Default off:
// expired records are then only replaced when their key is used again.
func WithCleanup(interval time.Duration) Option { return func(o *options) { o.cleanup = interval } }

func (o *options) validate() error {
	switch {
	case !strings.HasPrefix(o.root, "/") || strings.HasSuffix(o.root, "/") || strings.Contains(o.root, "//"):
		return errors.New("the root must be an absolute znode path without a trailing slash, e.g. /oncekit")
	case o.sessionTimeout < 100*time.Millisecond:
		return errors.New("the session timeout must be at least 100ms")
	case o.cleanup < 0:
		return errors.New("the cleanup interval must not be negative")
	}
	return nil
}
