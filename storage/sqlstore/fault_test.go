package sqlstore_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// The child process of TestEffectKilledMidTransaction: it runs a Guard
// whose effect has written its row and waits inside the transaction.
const (
	effectChildURL = "ONCEKIT_SQLSTORE_EFFECT_CHILD_URL"
	effectChildKey = "ONCEKIT_SQLSTORE_EFFECT_CHILD_KEY"
)

func runEffectChild(url, key string) {
	ctx := context.Background()
	s, err := sqlstore.Open(ctx, url)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(3)
	}
	g, err := idem.NewGuard(s, idem.WithTTL(2*time.Second))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(3)
	}
	_, _, err = g.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
		return []byte("child"), idem.Commit(ctx, sqlstore.Effect(func(ctx context.Context, tx *sql.Tx) error {
			if err := bump(ctx, tx, s.Dialect(), key, 10); err != nil {
				return err
			}
			fmt.Println("in effect") // the row is written, the transaction open
			time.Sleep(time.Minute)
			return nil
		}))
	})
	fmt.Println("error: Do returned:", err)
	os.Exit(3)
}

// A process killed with SIGKILL inside the transaction that writes its
// effect and completes its record leaves neither: the database rolls the
// transaction back with the connection. The retry, once the dead
// process's claim has run out, runs the work and writes the effect once.
func TestEffectKilledMidTransaction(t *testing.T) {
	for name, dbURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			admin := migrated(t, dbURL)
			createCounters(t, admin)
			key := idemdriver.ScopedKey("killed-mid-tx", time.Now().Format(time.RFC3339Nano))
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), effectChildURL+"="+dbURL, effectChildKey+"="+key)
			out, err := child.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			lines := make(chan string, 10)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			select {
			case l := <-lines:
				if l != "in effect" {
					t.Fatalf("child: %s", l)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the child did not reach its effect in 30 s")
			}
			_ = child.Process.Kill()
			_ = child.Wait()
			if n := count(t, admin, key); n != 0 {
				t.Fatalf("after the kill the effect's counter is %d, want 0 (rolled back)", n)
			}
			info, err := admin.InspectRecord(t.Context(), key)
			if err != nil || info.State == idemdriver.Completed {
				t.Fatalf("after the kill the record is %+v (%v), want in flight or gone", info, err)
			}

			g, err := idem.NewGuard(open(t, dbURL), idem.WithTTL(2*time.Second), idem.WithWait(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int32
			run := func(ctx context.Context) ([]byte, error) {
				runs.Add(1)
				return []byte("retry"), idem.Commit(ctx, sqlstore.Effect(func(ctx context.Context, tx *sql.Tx) error {
					return bump(ctx, tx, admin.Dialect(), key, 10)
				}))
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			for i, wantReplay := range []bool{false, true} {
				res, replayed, err := g.Do(ctx, key, "fp", run)
				if err != nil || replayed != wantReplay || string(res) != "retry" {
					t.Fatalf("Do %d after the kill: %q replayed=%v err=%v", i+1, res, replayed, err)
				}
			}
			if n, r := count(t, admin, key), runs.Load(); n != 1 || r != 1 {
				t.Errorf("effect written %d times, run %d times after the kill; want 1 and 1", n, r)
			}
		})
	}
}

// withHost returns dbURL pointing at addr instead of its server.
func withHost(t testing.TB, dbURL, addr string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// A connection cut in the middle of the effect's transaction rolls it
// back; the Guard asks again on a new connection, and the effect is
// written once.
func TestConnectionCutMidTransaction(t *testing.T) {
	for name, dbURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			admin := migrated(t, dbURL)
			createCounters(t, admin)
			u, _ := url.Parse(dbURL)
			proxy := testenv.StartProxy(t, u.Host)
			s := open(t, withHost(t, dbURL, proxy.Addr))
			g, err := idem.NewGuard(s, idem.WithTTL(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			key := idemdriver.ScopedKey("cut-mid-tx", time.Now().Format(time.RFC3339Nano))
			var attempts atomic.Int32
			effect := sqlstore.Effect(func(ctx context.Context, tx *sql.Tx) error {
				if err := bump(ctx, tx, s.Dialect(), key, 10); err != nil {
					return err
				}
				if attempts.Add(1) == 1 {
					proxy.Cut()
					_, err := tx.ExecContext(ctx, "SELECT 1")
					return err
				}
				return nil
			})
			res, replayed, err := g.Do(t.Context(), key, "fp", func(ctx context.Context) ([]byte, error) {
				return []byte("ok"), idem.Commit(ctx, effect)
			})
			if err != nil || replayed || string(res) != "ok" {
				t.Fatalf("Do with a connection cut mid-transaction: %q replayed=%v err=%v", res, replayed, err)
			}
			if a, n := attempts.Load(), count(t, admin, key); a != 2 || n != 1 {
				t.Errorf("effect tried %d times and written %d times; want 2 and 1", a, n)
			}
		})
	}
}

// A holder paused past its claim's lease finds, when it completes, that
// another process has claimed the key: its completion, effect included,
// is refused, and nothing of it is written.
func TestLateCompletionRefused(t *testing.T) {
	for name, dbURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			admin := migrated(t, dbURL)
			createCounters(t, admin)
			paused, other := open(t, dbURL), open(t, dbURL)
			ctx := t.Context()
			key := idemdriver.ScopedKey("late", time.Now().Format(time.RFC3339Nano))
			c1, err := paused.Begin(ctx, idemdriver.MustKey(key), "fp", 200*time.Millisecond)
			if err != nil || c1.State != idemdriver.Acquired {
				t.Fatalf("Begin: %v %v", c1.State, err)
			}
			time.Sleep(400 * time.Millisecond) // paused past the lease
			c2, err := other.Begin(ctx, idemdriver.MustKey(key), "fp", 5*time.Second)
			if err != nil || c2.State != idemdriver.Acquired || c2.Fence <= c1.Fence {
				t.Fatalf("Begin after the lease: %v fence %d (first %d) %v", c2.State, c2.Fence, c1.Fence, err)
			}
			effect := sqlstore.Effect(func(ctx context.Context, tx *sql.Tx) error { return bump(ctx, tx, paused.Dialect(), key, 10) })
			if err := paused.CompleteWith(ctx, c1, []byte("late"), time.Minute, effect); !errors.Is(err, lock.ErrLockLost) {
				t.Fatalf("the late completion: %v, want ErrLockLost", err)
			}
			if n := count(t, admin, key); n != 0 {
				t.Errorf("the late completion's effect was written (%d)", n)
			}
			if err := other.CompleteWith(ctx, c2, []byte("on time"), time.Minute, effect); err != nil {
				t.Fatal(err)
			}
			info, err := admin.InspectRecord(ctx, key)
			if err != nil || info.State != idemdriver.Completed || info.Fence != c2.Fence || count(t, admin, key) != 1 {
				t.Errorf("record %+v (%v), counter %d; want completed by the second claim, once", info, err, count(t, admin, key))
			}
		})
	}
}

// A database server of the test's own that it can crash and restart.
type restartable interface {
	Kill()
	Start()
}

// The database killed (SIGKILL, a crash) and restarted while a run is in
// flight and a duplicate waits: the run's completion is retried until the
// server is back and stored, the duplicate gets the replay, and the work
// ran once.
func TestDatabaseRestartedMidRun(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		srv := testenv.StartPostgres(t)
		restartedMidRun(t, srv, srv.URL)
	})
	t.Run("mysql", func(t *testing.T) {
		srv := testenv.StartMariaDB(t)
		restartedMidRun(t, srv, srv.URL)
	})
}

func restartedMidRun(t *testing.T, srv restartable, dbURL string) {
	s := migrated(t, dbURL)
	createCounters(t, s)
	g, err := idem.NewGuard(s, idem.WithTTL(5*time.Second), idem.WithWait(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	key := idemdriver.ScopedKey("restart", time.Now().Format(time.RFC3339Nano))
	var runs atomic.Int32
	started, restarted := make(chan struct{}), make(chan struct{})
	run := func(ctx context.Context) ([]byte, error) {
		if runs.Add(1) == 1 {
			close(started)
			<-restarted
		}
		return []byte("once"), idem.Commit(ctx, sqlstore.Effect(func(ctx context.Context, tx *sql.Tx) error {
			return bump(ctx, tx, s.Dialect(), key, 10)
		}))
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		res, _, err := g.Do(ctx, key, "fp", run)
		if err == nil && string(res) != "once" {
			err = fmt.Errorf("result %q", res)
		}
		first <- err
	}()
	<-started
	srv.Kill()
	dup := make(chan error, 1)
	go func() { // a duplicate arrives while the database is down
		res, replayed, err := g.Do(ctx, key, "fp", run)
		if err == nil && (!replayed || string(res) != "once") {
			err = fmt.Errorf("duplicate: %q replayed=%v", res, replayed)
		}
		dup <- err
	}()
	time.Sleep(500 * time.Millisecond)
	srv.Start()
	close(restarted)
	if err := <-first; err != nil {
		t.Fatalf("the run across the restart: %v", err)
	}
	// While the server is down the duplicate fails on its connection — to
	// connect, or on a pooled connection the crash cut (EOF, reset) — or,
	// once it is back, waits and replays; it never runs.
	if err := <-dup; err != nil && !lostConnection(err) {
		t.Errorf("the duplicate: %v", err)
	}
	res, replayed, err := g.Do(ctx, key, "fp", run)
	if err != nil || !replayed || string(res) != "once" {
		t.Errorf("after the restart: %q replayed=%v %v", res, replayed, err)
	}
	if r, n := runs.Load(), count(t, s, key); r != 1 || n != 1 {
		t.Errorf("ran %d times, effect written %d times; want 1 and 1", r, n)
	}
}

// lostConnection reports an error of a request that lost its way to the
// server (no connection, or one the server's crash cut), said as such.
func lostConnection(err error) bool {
	return strings.Contains(err.Error(), "no answer from the database")
}

// A claim whose answer is lost — the statement ran on the server, the
// caller's ctx ended before the reply came — is given back by the Store:
// a retry claims the key (its second attempt) at once, not once the lost
// claim's lease has run out.
func TestLostBeginAnswerGivesTheClaimBack(t *testing.T) {
	for name, dbURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			migrated(t, dbURL)
			u, _ := url.Parse(dbURL)
			proxy := testenv.StartProxy(t, u.Host)
			s, other := open(t, withHost(t, dbURL, proxy.Addr)), open(t, dbURL)
			ctx := t.Context()
			warm, err := s.Begin(ctx, idemdriver.MustKey("lost-answer-warm:"+time.Now().Format(time.RFC3339Nano)), "fp", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, warm, []byte("r"), time.Minute); err != nil {
				t.Fatal(err)
			}
			key := "lost-answer:" + time.Now().Format(time.RFC3339Nano)
			proxy.StallAfter(testenv.Contains([]byte(key)))
			bctx, cancel := context.WithCancel(ctx)
			errc := make(chan error, 1)
			go func() {
				_, err := s.Begin(bctx, idemdriver.MustKey(key), "fp", 30*time.Second)
				errc <- err
			}()
			// The claim is written (the server ran the statement); its
			// answer is held by the proxy.
			proxy.WaitStalled(t, 10*time.Second)
			time.Sleep(100 * time.Millisecond) // (the server runs the statement it got)
			deadline := time.Now().Add(10 * time.Second)
			for {
				c, err := other.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				if c.State == idemdriver.InFlight {
					break
				}
				if c.State == idemdriver.Acquired {
					t.Fatalf("the key was free: the claim under test never reached the server")
				}
				if time.Now().After(deadline) {
					t.Fatalf("no claim written: %+v", c)
				}
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			if err := <-errc; err == nil {
				t.Fatal("Begin whose ctx ended before its answer came returned no error")
			}
			proxy.Resume()
			deadline = time.Now().Add(10 * time.Second)
			for {
				c, err := other.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				if c.State == idemdriver.Acquired {
					if c.Attempt != 2 {
						t.Errorf("the retry's attempt %d, want 2 (the lost claim counted)", c.Attempt)
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("10 s after the lost answer the key is still %v (its lease is 30 s): not given back", c.State)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// An acquisition whose answer is lost — the statement took the row on the
// server, the caller's ctx ended before the reply came — frees the key:
// another process takes it at once, not once the lost hold's TTL has run
// out. Through the server's queue and through the waiters table
// (notify=false).
func TestLostAcquireAnswerFreesTheKey(t *testing.T) {
	for name, dbURL := range databases(t) {
		for _, mode := range []string{"server-queue", "table-queue"} {
			t.Run(name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				migrated(t, dbURL)
				u, _ := url.Parse(dbURL)
				proxy := testenv.StartProxy(t, u.Host)
				via := withHost(t, dbURL, proxy.Addr)
				if mode == "table-queue" {
					via = withParam(via, "notify=false")
				}
				s, other := open(t, via), open(t, dbURL)
				ctx := t.Context()
				warm, err := s.TryAcquire(ctx, "lost-acquire-warm:"+time.Now().Format(time.RFC3339Nano), time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				if err := warm.Release(ctx); err != nil {
					t.Fatal(err)
				}
				key := "lost-acquire:" + mode + ":" + time.Now().Format(time.RFC3339Nano)
				proxy.StallAfter(testenv.Contains([]byte(key)))
				actx, cancel := context.WithCancel(ctx)
				errc := make(chan error, 1)
				go func() {
					_, err := s.TryAcquire(actx, key, 30*time.Second)
					errc <- err
				}()
				proxy.WaitStalled(t, 10*time.Second)
				time.Sleep(100 * time.Millisecond) // (the server runs the statement it got)
				deadline := time.Now().Add(10 * time.Second)
				// The row is taken (the server ran the statement); its answer
				// is held by the proxy.
				for {
					l, err := other.TryAcquire(ctx, key, time.Minute)
					if err == nil {
						_ = l.Release(ctx)
						t.Fatal("the key was free: the acquisition under test never reached the server")
					}
					if errors.Is(err, lock.ErrNotAcquired) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the key never taken: %v", err)
					}
					time.Sleep(20 * time.Millisecond)
				}
				cancel()
				if err := <-errc; err == nil {
					t.Fatal("TryAcquire whose ctx ended before its answer came returned no error")
				}
				proxy.Resume()
				deadline = time.Now().Add(10 * time.Second)
				for {
					l, err := other.TryAcquire(ctx, key, time.Minute)
					if err == nil {
						_ = l.Release(ctx)
						return
					}
					if !errors.Is(err, lock.ErrNotAcquired) {
						t.Fatal(err)
					}
					if time.Now().After(deadline) {
						t.Fatalf("10 s after the lost answer the key is still held (its TTL is 30 s): %v", err)
					}
					time.Sleep(50 * time.Millisecond)
				}
			})
		}
	}
}
