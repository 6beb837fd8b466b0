package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"testing"

	"github.com/oncekit/oncekit/internal/testenv"
)

// stmtStatus reads c's session counters of prepared statements: prepared
// and executed.
func stmtStatus(t *testing.T, c *sql.Conn) (prepared, executed int) {
	t.Helper()
	rows, err := c.QueryContext(context.Background(), "SHOW SESSION STATUS WHERE Variable_name IN ('Com_stmt_prepare', 'Com_stmt_execute')")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		if name == "Com_stmt_prepare" {
			prepared = n
		} else {
			executed = n
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return prepared, executed
}

// A connection of OpenDB's prepares a statement once and runs it
// prepared from then on; up to myStmtLimit statements, then as text. A
// *sql.DB made with sql.Open sends text.
func TestMySQLStatementsStayPrepared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, err := url.Parse(testenv.MySQLURL(t))
	if err != nil {
		t.Fatal(err)
	}
	db, err := OpenDB(u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p0, e0 := stmtStatus(t, c)
	for i := range 10 {
		if _, err := connExec(ctx, c, "DO ? + 1", int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	p1, e1 := stmtStatus(t, c)
	if p1-p0 != 1 || e1-e0 != 10 {
		t.Fatalf("10 runs of one statement: %d prepared, %d executed; want 1 and 10", p1-p0, e1-e0)
	}
	for i := range myStmtLimit + 10 {
		if _, err := connExec(ctx, c, fmt.Sprintf("DO %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	p2, e2 := stmtStatus(t, c)
	if p2-p1 != myStmtLimit-1 || e2-e1 != myStmtLimit-1 {
		t.Fatalf("%d statements: %d prepared, %d executed; want %d of each (the rest as text)", myStmtLimit+10, p2-p1, e2-e1, myStmtLimit-1)
	}

	dsn, err := MySQLDSN(u)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	pc, err := plain.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	p0, e0 = stmtStatus(t, pc)
	for range 3 {
		if _, err := connExec(ctx, pc, "DO ?", 1); err != nil {
			t.Fatal(err)
		}
	}
	if p, e := stmtStatus(t, pc); p != p0 || e != e0 {
		t.Fatalf("a plain *sql.DB: %d prepared, %d executed; want text", p-p0, e-e0)
	}
}
