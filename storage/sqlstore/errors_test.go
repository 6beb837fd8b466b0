package sqlstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// A lost way to the database — no connection, one cut mid-statement, a
// server that says it is going away as it drops it — is told apart from the
// database's answers and from the caller's context ending, and the error
// says so.
func TestConnectionLostErrors(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("query: %w", err) }
	for _, tc := range []struct {
		name string
		err  error
		lost bool
	}{
		{"cut mid-reply", wrap(io.ErrUnexpectedEOF), true},
		{"bad connection", wrap(driver.ErrBadConn), true},
		{"mysql invalid connection", wrap(mysql.ErrInvalidConn), true},
		{"postgres shutting down", wrap(&pgconn.PgError{Code: "57P01"}), true},
		{"postgres crash shutdown", wrap(&pgconn.PgError{Code: "57P02"}), true},
		{"postgres connection failure", wrap(&pgconn.PgError{Code: "08006"}), true},
		{"mysql shutdown in progress", wrap(&mysql.MySQLError{Number: 1053}), true},
		{"postgres unique violation", wrap(&pgconn.PgError{Code: "23505"}), false},
		{"postgres deadlock", wrap(&pgconn.PgError{Code: "40P01"}), false},
		{"mysql duplicate key", wrap(&mysql.MySQLError{Number: 1062}), false},
		{"caller cancelled", wrap(context.Canceled), false},
		{"caller's deadline", wrap(context.DeadlineExceeded), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := connectionLost(tc.err); got != tc.lost {
				t.Errorf("connectionLost = %v, want %v", got, tc.lost)
			}
			if tc.lost && serverAnswer(tc.err) {
				t.Error("a lost connection counted as the server's answer")
			}
			msg := (&Store{}).errWrap("begin", "k", tc.err)
			if !errors.Is(msg, errors.Unwrap(tc.err)) {
				t.Errorf("%v does not wrap %v", msg, tc.err)
			}
			if said := strings.Contains(msg.Error(), "no answer from the database"); said != tc.lost {
				t.Errorf("%q: says the database did not answer: %v, want %v", msg, said, tc.lost)
			}
		})
	}
}

func TestReturningVersion(t *testing.T) {
	for v, want := range map[string]bool{
		"10.11.6-MariaDB-0+deb12u1": true,
		"10.5.0-MariaDB":            true,
		"5.5.5-10.6.12-MariaDB-log": true,
		"10.4.32-MariaDB":           false,
		"11.4.2-MariaDB":            true,
		"8.0.36":                    false,
		"8.4.0-commercial":          false,
		"MariaDB":                   false,
	} {
		if got := returningVersion(v); got != want {
			t.Errorf("returningVersion(%q) = %v, want %v", v, got, want)
		}
	}
}
