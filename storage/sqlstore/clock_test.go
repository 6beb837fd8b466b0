package sqlstore_test

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// MySQL's clock reads the same in every session time zone, also in the
// hour a DST change repeats: at 01:30 UTC on 2026-10-25 Paris reads 02:30
// for the second time, and a clock taken from the local time (UNIX_TIMESTAMP
// of NOW) stepped back an hour there, expiring every lease granted in the
// last TTL at once. The server's clock is set with SET timestamp, as the
// change itself cannot be waited for.
func TestMySQLClockIgnoresTimeZone(t *testing.T) {
	u := testenv.MySQLURL(t)
	s := open(t, u)
	ctx := context.Background()
	var loaded int
	if err := s.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM mysql.time_zone_name WHERE Name = 'Europe/Paris'").Scan(&loaded); err != nil {
		t.Fatal(err)
	}
	if loaded == 0 {
		loadParisZone(t, u)
	}
	conn, err := s.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const at = 1792891800_500000 // 2026-10-25 01:30:00.5 UTC: 02:30 in Paris, the second time
	for _, zone := range []string{"'Europe/Paris'", "'+00:00'", "'-07:00'"} {
		if _, err := conn.ExecContext(ctx, "SET time_zone = "+zone+", timestamp = 1792891800.5"); err != nil {
			t.Fatal(err)
		}
		var got int64
		if err := conn.QueryRowContext(ctx, "SELECT "+sqlstore.NowUS(sqlstore.MySQL)).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != at {
			t.Errorf("time zone %s: the clock reads %d µs, want %d (off by %d s)", zone, got, int64(at), (got-at)/1_000_000)
		}
	}
	if _, err := conn.ExecContext(ctx, "SET timestamp = DEFAULT"); err != nil {
		t.Fatal(err)
	}
}

// loadParisZone loads Europe/Paris into the server's time zone tables
// (mariadb-tzinfo-to-sql, from the mariadb packages that run the server).
func loadParisZone(t *testing.T, mysqlURL string) {
	t.Helper()
	u, err := url.Parse(mysqlURL)
	if err != nil {
		t.Fatal(err)
	}
	zone := "/usr/share/zoneinfo/Europe/Paris"
	if _, err := os.Stat(zone); err != nil {
		t.Fatalf("%s: %v (Debian's tzdata)", zone, err)
	}
	gen := exec.Command("mariadb-tzinfo-to-sql", zone, "Europe/Paris")
	sqlText, err := gen.Output()
	if err != nil {
		t.Fatalf("mariadb-tzinfo-to-sql: %v", err)
	}
	args := []string{"-h", u.Hostname(), "-P", u.Port(), "-u", u.User.Username()}
	if p, ok := u.User.Password(); ok {
		args = append(args, "-p"+p)
	}
	load := exec.Command("mariadb", append(args, "mysql")...)
	load.Stdin = strings.NewReader(string(sqlText))
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("loading the zone: %v: %s", err, out)
	}
}

// A table prefix with a schema ("app.oncekit_") migrates and works: index
// names take no schema (an index lives in its table's), so Migrate writes
// them without it.
func TestSchemaQualifiedPrefix(t *testing.T) {
	for name, u := range databases(t) {
		t.Run(name, func(t *testing.T) {
			schema := "oncekit_schema_test"
			admin := open(t, u)
			if name == "postgres" {
				if _, err := admin.DB().Exec("CREATE SCHEMA IF NOT EXISTS " + schema); err != nil {
					t.Fatal(err)
				}
			} else {
				pu, err := url.Parse(u)
				if err != nil {
					t.Fatal(err)
				}
				schema = strings.TrimPrefix(pu.Path, "/") // the test database (MYSQL_URL)
			}
			s := migrated(t, u, sqlstore.WithTablePrefix(schema+".q_"))
			if err := s.Migrate(context.Background()); err != nil { // again: IF NOT EXISTS
				t.Fatalf("second Migrate: %v", err)
			}
			l, err := s.TryAcquire(t.Context(), "schema-qualified", time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		})
	}
}
