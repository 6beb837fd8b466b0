package testenv

import (
	"context"
	"database/sql"
	"testing"
	"time"
)

// Kill takes a PostgreSQL server's backends down with it — each is a
// session leader of its own, outside the postmaster's process group — so
// that a Start right after finds no process still attached to the old
// server's shared memory.
func TestPostgresKillTakesBackends(t *testing.T) {
	p := StartPostgres(t)
	db, err := sql.Open("pgx", p.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conns []*sql.Conn
	for range 8 { // a backend each
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.PingContext(ctx); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	kids := childrenOf(p.cmd.Process.Pid)
	if len(kids) < len(conns) {
		t.Fatalf("%d children of the postmaster, want at least %d backends", len(kids), len(conns))
	}
	p.Kill()
	for _, k := range kids {
		if alive(k) {
			t.Errorf("process %d of the killed server still runs", k)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	p.Start()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
}
