package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// Behind a proxy that spreads connections over two MariaDB servers, a
// cancelled wait on one server is never ended by a KILL QUERY sent to
// the other, where the same connection id is an unrelated session whose
// statement it would kill.
func TestCancelledWaitKillsNothingOnAnotherServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two MariaDB servers of its own")
	}
	a, b := testenv.StartMariaDB(t), testenv.StartMariaDB(t)
	for _, srv := range []*testenv.MariaDBProcess{a, b} {
		migrated(t, srv.URL)
	}
	// Sessions on a until its connection ids are well past b's, so that a
	// session on b can be opened with the waiter's id below.
	warm, err := sqlstore.OpenDB(a.URL)
	if err != nil {
		t.Fatal(err)
	}
	warm.SetMaxIdleConns(0)
	for range 50 {
		if err := warm.PingContext(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	warm.Close()
	holder := open(t, a.URL)
	key := "kill-" + fmt.Sprint(time.Now().UnixNano())
	held, err := holder.TryAcquire(t.Context(), key, 4*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())

	// The proxy's first connection goes to a (the waiter's), every later
	// one to b.
	hostOf := func(raw string) string { u, _ := url.Parse(raw); return u.Host }
	p := testenv.StartProxy(t, hostOf(a.URL))
	waiter := open(t, strings.Replace(a.URL, hostOf(a.URL), p.Addr, 1))
	ctx, cancel := context.WithCancel(t.Context())
	acquired := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(ctx, key, 4*time.Second)
		if err == nil {
			_ = l.Release(context.Background())
		}
		acquired <- err
	}()
	// The waiter's session on a, waiting in GET_LOCK.
	var id int64
	for deadline := time.Now().Add(5 * time.Second); id == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never waited on a")
		}
		_ = holder.DB().QueryRowContext(t.Context(), "SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE '%GET_LOCK%' AND INFO NOT LIKE '%PROCESSLIST%' LIMIT 1").Scan(&id)
	}
	p.Retarget(hostOf(b.URL))
	// A session on b with the same id, busy with a statement of its own.
	bdb, err := sqlstore.OpenDB(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	bdb.SetMaxIdleConns(0) // a connection closed is gone: the next is new
	var victim *sql.Conn
	for victim == nil {
		c, err := bdb.Conn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var cid int64
		if err := c.QueryRowContext(t.Context(), "SELECT CONNECTION_ID()").Scan(&cid); err != nil {
			t.Fatal(err)
		}
		switch {
		case cid == id:
			victim = c
		case cid > id:
			t.Fatalf("b's connection ids are past the waiter's (%d > %d)", cid, id)
		default:
			_ = c.Close()
		}
	}
	defer victim.Close()
	slept := make(chan error, 1)
	go func() {
		var r int
		err := victim.QueryRowContext(context.Background(), "SELECT SLEEP(2)").Scan(&r)
		if err == nil && r != 0 {
			err = errors.New("SLEEP was interrupted")
		}
		slept <- err
	}()
	time.Sleep(200 * time.Millisecond) // the victim sleeps
	cancel()
	if err := <-slept; err != nil {
		t.Errorf("the cancelled wait's KILL QUERY ended a statement of another server's session with the same id: %v", err)
	}
	if err := <-acquired; !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("the cancelled Acquire = %v, want lock.ErrNotAcquired", err)
	}
}
