package storage_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/storage"
	_ "github.com/oncekit/oncekit/storage/all"
	"github.com/oncekit/oncekit/storage/driver"
	"github.com/oncekit/oncekit/storage/etcdstore"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
	"github.com/oncekit/oncekit/storage/redlockstore"
	"github.com/oncekit/oncekit/storage/sqlstore"
	"github.com/oncekit/oncekit/storage/zkstore"
)

// Every form opens the driver it names, which takes a lock and runs a
// Guard; Close closes the clients Open made.
func TestOpenEachForm(t *testing.T) {
	redis := testenv.RedisAddrs(t, 5)
	forms := map[string]string{
		"memory":        "memory://",
		"redis":         "redis://" + redis[0] + "/0?prefix=storage-test:lock:&pool_size=4",
		"redis-cluster": "redis-cluster://" + strings.Join(testenv.RedisClusterAddrs(t), ","),
		"redlock":       "redlock://" + strings.Join(redis[:3], ",") + "?dial_timeout=2s",
		"etcd":          "etcd://" + strings.Join(testenv.EtcdAddrs(t), ","),
		"postgres":      withParam(testenv.PostgresURL(t), "prefix=storage_test_"),
		"mysql":         withParam(testenv.MySQLURL(t), "prefix=storage_test_&timeout=2s"),
		"zk":            "zk://" + strings.Join(testenv.ZooKeeperAddrs(t), ",") + "/storage-test?session_timeout=4s",
		"redis-sentinel": func() string {
			sentinels, master := testenv.SentinelAddrs(t)
			return "redis-sentinel://" + strings.Join(sentinels, ",") + "?master_name=" + master + "&replicas=1&replica_timeout=2s"
		}(),
	}
	for scheme, url := range forms {
		t.Run(scheme, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			obs := &endCounter{}
			st, err := storage.Open(ctx, url, storage.WithTimeout(5*time.Second), storage.WithObserver(obs))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if observe.ObserverOf(st) != obs || observe.DriverOf(st) == "" {
				t.Errorf("the store's observer %v (driver %q), want the one given to Open", observe.ObserverOf(st), observe.DriverOf(st))
			}
			checkDriver(t, scheme, st)
			if err := st.Ping(ctx); err != nil {
				t.Errorf("Ping: %v", err)
			}
			key := "storage-test-" + time.Now().Format(time.RFC3339Nano)
			l, err := st.TryAcquire(ctx, key, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			g, err := idem.NewGuard(st)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				res, replayed, err := g.Do(ctx, idemdriver.ScopedKey("storage-test", key), "fp", func(context.Context) ([]byte, error) { return []byte("once"), nil })
				if err != nil || string(res) != "once" || replayed != (i == 1) {
					t.Errorf("Do %d: %q replayed=%v err=%v", i, res, replayed, err)
				}
			}
			m, err := lock.NewMutex(st, lock.WithTTL(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Do(ctx, key, func(ctx context.Context, l lock.Lease) error { return nil }); err != nil {
				t.Fatal(err)
			}
			// Every operation reached the observer given to Open, under the
			// driver's name.
			seen := obs.ops()
			for _, op := range []observe.Op{observe.LockAcquire, observe.LockRelease, observe.IdemBegin, observe.IdemComplete} {
				if !seen[op] {
					t.Errorf("the observer given to Open saw no %s (saw %v)", op, seen)
				}
			}
			if d := obs.driver(); d != observe.DriverOf(st) {
				t.Errorf("events name the driver %q, want %q", d, observe.DriverOf(st))
			}
		})
	}
}

// checkDriver checks that Open returned the driver itself, with the
// clients it made.
func checkDriver(t *testing.T, scheme string, st storage.Store) {
	t.Helper()
	switch scheme {
	case "memory":
		if _, ok := st.(*memstore.Store); !ok {
			t.Errorf("memory:// opened a %T", st)
		}
	case "redis", "redis-cluster", "redis-sentinel":
		if r, ok := st.(*redisstore.Store); !ok || r.Client() == nil {
			t.Errorf("%s:// opened a %T", scheme, st)
		} else if _, ok := r.Client().(redis.UniversalClient); !ok {
			t.Errorf("%s://'s client is a %T", scheme, r.Client())
		}
	case "redlock":
		if r, ok := st.(*redlockstore.Store); !ok || len(r.Clients()) != 3 {
			t.Errorf("redlock:// opened a %T", st)
		}
	case "etcd":
		if e, ok := st.(*etcdstore.Store); !ok || e.Client() == nil {
			t.Errorf("etcd:// opened a %T", st)
		}
	case "postgres", "mysql":
		if q, ok := st.(*sqlstore.Store); !ok || q.DB() == nil || string(q.Dialect()) != scheme {
			t.Errorf("%s:// opened a %T", scheme, st)
		}
	case "zk":
		if z, ok := st.(*zkstore.Store); !ok || z.Conn() == nil {
			t.Errorf("zk:// opened a %T", st)
		}
	default:
		t.Fatalf("no check for %s://", scheme)
	}
}

// endCounter records the operations an Observer saw end.
type endCounter struct {
	mu      sync.Mutex
	seen    map[observe.Op]bool
	drivers map[string]bool
}

func (c *endCounter) Start(ctx context.Context, _ observe.Event) context.Context { return ctx }
func (c *endCounter) End(_ context.Context, ev observe.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen, c.drivers = map[observe.Op]bool{}, map[string]bool{}
	}
	c.seen[ev.Op] = true
	c.drivers[ev.Driver] = true
}
func (c *endCounter) Record(ctx context.Context, ev observe.Event) { c.End(ctx, ev) }

func (c *endCounter) ops() map[observe.Op]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.seen)
}

// driver is the one driver name the events carried ("" for none or several).
func (c *endCounter) driver() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.drivers) != 1 {
		return fmt.Sprint(slices.Collect(maps.Keys(c.drivers)))
	}
	for d := range c.drivers {
		return d
	}
	return ""
}

// withParam adds a query parameter to url.
func withParam(url, param string) string {
	if strings.Contains(url, "?") {
		return url + "&" + param
	}
	return url + "?" + param
}

// The capabilities of the driver survive Open: a Redis store is an
// idemdriver.EffectStore and an idemdriver.Waiter, as redisstore.Store is.
func TestOpenKeepsCapabilities(t *testing.T) {
	st, err := storage.Open(t.Context(), "redis://"+testenv.RedisAddrs(t, 1)[0])
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, ok := st.(idemdriver.EffectStore); !ok {
		t.Error("a Redis store from Open is not an idemdriver.EffectStore")
	}
	if _, ok := st.(idemdriver.Waiter); !ok {
		t.Error("a Redis store from Open is not an idemdriver.Waiter")
	}
	if _, ok := st.(lockdriver.MultiLocker); !ok {
		t.Error("a Redis store from Open is not a lockdriver.MultiLocker")
	}
}

// Bad URLs get a clear error and open nothing.
func TestOpenRejectsBadURLs(t *testing.T) {
	for url, want := range map[string]string{
		"":                                                      "no store URL",
		"127.0.0.1:6379":                                        "no scheme",
		"ftp://x":                                               "not supported",
		"redlock://":                                            "names no host",
		"redlock://a:1,,b:2":                                    "empty host",
		"redis://127.0.0.1:6379/notadb":                         "invalid database",
		"redis://127.0.0.1:6379?no_such=1":                      "unexpected option",
		"redis-sentinel://127.0.0.1:26379":                      "master_name",
		"redis-cluster://":                                      "names no host",
		"etcd://127.0.0.1:2379?pool_size=4":                     "no parameter",
		"memory://host":                                         "takes no host",
		"redis://127.0.0.1:6379?cert=x.pem":                     "cert and key go together",
		"redis://127.0.0.1:6379?ca=/no/such":                    "ca:",
		"mysql://root@127.0.0.1:1":                              "no database name",
		"mysql://root@127.0.0.1:1/db?timeout=soon":              "invalid duration",
		"postgres://127.0.0.1:1/db?migrate=sometimes":           "not a boolean",
		"postgres://127.0.0.1:1/db?record_prefix=x":             "one table prefix",
		"zk://127.0.0.1:2181?pool_size=4":                       "no parameter but session_timeout",
		"zk://127.0.0.1:2181?session_timeout=soon":              "session_timeout",
		"zk://127.0.0.1:2181?prefix=x":                          "no parameter but session_timeout",
		"redis://127.0.0.1:6379?replicas=0":                     "at least 1",
		"redis://127.0.0.1:6379?replicas=1&replica_timeout=-1s": "positive duration",
		"etcd://127.0.0.1:2379?replicas=1":                      "no parameter but",
		"redis://127.0.0.1:6379?replica_timeout=1s":             "goes with replicas=N",
	} {
		st, err := storage.Open(context.Background(), url)
		if err == nil {
			_ = st.Close()
			t.Errorf("Open(%q) = nil error, want one saying %q", url, want)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v, want it to say %q", url, err, want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := storage.Open(ctx, "memory://"); !errors.Is(err, context.Canceled) {
		t.Errorf("Open with a cancelled context: %v", err)
	}
}

// A Sentinel URL opens a failover client over the sentinels (no request
// is made until first use).
func TestOpenSentinelForm(t *testing.T) {
	st, err := storage.Open(context.Background(), "redis-sentinel://127.0.0.1:26379,127.0.0.1:26380/0?master_name=m")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if r, ok := st.(*redisstore.Store); !ok {
		t.Errorf("opened a %T", st)
	} else if _, ok := r.Client().(*redis.Client); !ok {
		t.Errorf("the client is a %T, want go-redis' failover *redis.Client", r.Client())
	}
}

// Ping fails, with the driver's error, when the store cannot serve.
func TestPingUnreachable(t *testing.T) {
	for _, url := range []string{"redis://127.0.0.1:1", "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "etcd://127.0.0.1:1"} {
		st, err := storage.Open(context.Background(), url, storage.WithTimeout(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := st.Ping(ctx); err == nil {
			t.Errorf("Ping of %s: nil, want an error", url)
		}
		cancel()
		st.Close()
	}
}

// A program that imports storage and one driver links that driver's client
// only, and Open says, for a form whose driver the program left out,
// which schemes it has and what to import, and lists only the forms of
// the drivers it imports.
func TestOneDriverLinksOneClient(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	deps, err := exec.Command(goTool, "list", "-deps", "./testdata/redisonly").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, deps)
	}
	if !strings.Contains(string(deps), "github.com/redis/go-redis/v9\n") {
		t.Fatalf("the Redis-only program does not link go-redis:\n%s", deps)
	}
	for _, heavy := range []string{"github.com/jackc/pgx", "github.com/go-sql-driver/mysql", "go.etcd.io/etcd", "github.com/go-zookeeper/zk",
		"github.com/oncekit/oncekit/storage/sqlstore", "github.com/oncekit/oncekit/storage/etcdstore"} {
		if strings.Contains(string(deps), heavy) {
			t.Errorf("the Redis-only program links %s", heavy)
		}
	}
	out, err := exec.Command(goTool, "run", "./testdata/redisonly").CombinedOutput()
	if err != nil {
		t.Fatalf("go run: %v\n%s", err, out)
	}
	want := "*redisstore.Store\n" + `storage: store URL scheme "postgres" is not supported by the drivers this program imports (registered: ` +
		`mem, memory, redis, redis-cluster, redis-sentinel, rediss, rediss-cluster, rediss-sentinel; import the driver's package, ` +
		`github.com/oncekit/oncekit/storage/<name>store, or storage/all for every one)` + "\nStore URLs:\n  memory://"
	if !strings.HasPrefix(string(out), want) || strings.Contains(string(out), "postgres://user") {
		t.Errorf("the Redis-only program printed\n%s\nwant it to start\n%s\nand list no form of a driver it left out", out, want)
	}
}

// The drivers that keep a pool of connections warm it; those of one
// connection (etcd, ZooKeeper) and memory are not Warmers.
func TestWarmers(t *testing.T) {
	warmers := map[reflect.Type]bool{
		reflect.TypeFor[*memstore.Store]():     false,
		reflect.TypeFor[*redisstore.Store]():   true,
		reflect.TypeFor[*redlockstore.Store](): true,
		reflect.TypeFor[*etcdstore.Store]():    false,
		reflect.TypeFor[*sqlstore.Store]():     true,
		reflect.TypeFor[*zkstore.Store]():      false,
	}
	for typ, want := range warmers {
		if got := typ.Implements(reflect.TypeFor[storage.Warmer]()); got != want {
			t.Errorf("%s is a storage.Warmer: %v, want %v", typ, got, want)
		}
	}
}

// Every driver keeps stock but Redlock, which says why (stock.Refuser).
func TestStockKeepers(t *testing.T) {
	for typ, want := range map[reflect.Type]bool{
		reflect.TypeFor[*memstore.Store]():     true,
		reflect.TypeFor[*redisstore.Store]():   true,
		reflect.TypeFor[*redlockstore.Store](): false,
		reflect.TypeFor[*etcdstore.Store]():    true,
		reflect.TypeFor[*sqlstore.Store]():     true,
		reflect.TypeFor[*zkstore.Store]():      true,
	} {
		if got := typ.Implements(reflect.TypeFor[stockdriver.Store]()); got != want {
			t.Errorf("%s keeps stock (stockdriver.Store): %v, want %v", typ, got, want)
		}
		if refuses := typ.Implements(reflect.TypeFor[stock.Refuser]()); refuses == want {
			t.Errorf("%s: keeps stock %v, refuses it with a reason %v", typ, want, refuses)
		}
	}
}

// Every driver's Store shows the contract (driver.Store), the optional
// capabilities drivers share, and the few methods of its own listed here,
// and nothing else: a method added to a driver by mistake (a helper made
// public, kit reachable from a user's value) fails this test, and one
// added on purpose is added here, in the driver's documentation and in
// CHANGELOG.md.
func TestDriverSurfaces(t *testing.T) {
	contract := map[string]bool{}
	ct := reflect.TypeFor[storage.Store]()
	for i := range ct.NumMethod() {
		contract[ct.Method(i).Name] = true
	}
	// The capabilities: idemdriver.Waiter, idemdriver.EffectStore, the repairs oncectl
	// uses, lockdriver.MultiLocker, storage.Warmer, stockdriver.Store.
	shared := map[string]bool{"WaitChange": true, "CompleteWith": true, "ForceRelease": true, "DeleteRecord": true, "AcquireAll": true, "Warm": true,
		"ApplyStock": true}
	own := map[reflect.Type][]string{
		reflect.TypeFor[*memstore.Store]():     nil,
		reflect.TypeFor[*redisstore.Store]():   {"Client"},
		reflect.TypeFor[*redlockstore.Store](): {"Clients", "Quorum", "StockRefusal"},
		reflect.TypeFor[*etcdstore.Store]():    {"Client"},
		reflect.TypeFor[*sqlstore.Store]():     {"CheckLayout", "Cleanup", "CompleteInTx", "DB", "Dialect", "Migrate", "Schema", "StockTables", "Tables"},
		reflect.TypeFor[*zkstore.Store]():      {"Cleanup", "Conn", "SessionTimeout"},
	}
	for typ, extra := range own {
		has := map[string]bool{}
		for i := range typ.NumMethod() {
			m := typ.Method(i).Name
			has[m] = true
			if !contract[m] && !shared[m] && !slices.Contains(extra, m) {
				t.Errorf("%s has method %s, which is neither the contract, a shared capability nor listed as its own", typ, m)
			}
		}
		for m := range contract {
			if !has[m] {
				t.Errorf("%s lacks %s of driver.Store", typ, m)
			}
		}
		for _, m := range extra {
			if !has[m] {
				t.Errorf("%s no longer has %s: update the list", typ, m)
			}
		}
	}
}

// A parameter's space reaches the driver as %20, which every driver's
// parser reads as a space (pgx reads '+' as itself: PostgreSQL's
// options=-c name=value broke through Open).
func TestOpenKeepsSpaces(t *testing.T) {
	var got string
	driver.Register(driver.Info{Package: "spacestore", Schemes: []string{"spacetest"}, Usage: "  spacetest://   a test's",
		Open: func(_ context.Context, u *driver.URL) (driver.Store, error) {
			got = u.URL.RawQuery
			return nil, errors.New("not a store")
		}})
	_, _ = storage.Open(context.Background(), "spacetest://h/db?options=-c%20synchronous_commit%3Doff&prefix=p")
	if got != "options=-c%20synchronous_commit%3Doff" {
		t.Errorf("the driver got the query %q", got)
	}
}
