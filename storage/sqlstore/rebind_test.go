package sqlstore

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// rebind numbers the placeholders PostgreSQL would see as such, and only
// those: not a ? inside a string literal (plain, E'…' with its escapes,
// dollar-quoted), a quoted identifier or a comment; ?? is a literal ?.
func TestRebindSkipsLiteralsAndComments(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"SELECT 1", "SELECT 1"},
		{"WHERE a = ? AND b = ?", "WHERE a = $1 AND b = $2"},
		{"VALUES (?, 'why?', ?)", "VALUES ($1, 'why?', $2)"},
		{"VALUES ('it''s?', ?)", "VALUES ('it''s?', $1)"},
		{`VALUES (E'it\'s?', ?)`, `VALUES (E'it\'s?', $1)`},
		{`VALUES (e'\\', ?)`, `VALUES (e'\\', $1)`},
		{`VALUES ('a\', ?)`, `VALUES ('a\', $1)`}, // no escapes outside E'…'
		{`SELECT "col?" FROM t WHERE x = ?`, `SELECT "col?" FROM t WHERE x = $1`},
		{`SELECT "a""?" , ?`, `SELECT "a""?" , $1`},
		{"SELECT ? -- why?\n, ?", "SELECT $1 -- why?\n, $2"},
		{"SELECT ? -- why?", "SELECT $1 -- why?"},
		{"SELECT ? /* a /* nested? */ still? */ , ?", "SELECT $1 /* a /* nested? */ still? */ , $2"},
		{"SELECT $$why?$$, ?", "SELECT $$why?$$, $1"},
		{"SELECT $tag$ $$? $tag$, ?", "SELECT $tag$ $$? $tag$, $1"},
		{"SELECT $1, ?", "SELECT $1, $1"}, // (a $n already there is the caller's)
		{"SELECT a$b, ?", "SELECT a$b, $1"},
		{"WHERE doc ?? 'k' AND doc ??| ? AND id = ?", "WHERE doc ? 'k' AND doc ?| $1 AND id = $2"},
		{"SELECT 'unclosed?", "SELECT 'unclosed?"},
		{"SELECT /* unclosed? ", "SELECT /* unclosed? "},
		{"SELECT $x$ unclosed? ", "SELECT $x$ unclosed? "},
		{"SELECT ?, 'é?', ?", "SELECT $1, 'é?', $2"},
	} {
		if got := rebind(c.in); got != c.want {
			t.Errorf("rebind(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// The Store's own statements (MySQL's, which keep their ? placeholders,
// and with them their ” literals) number as a plain count of their ?
// does: none has a ? inside a literal or a comment, nor a ??.
func TestRebindKeepsTheStoresStatements(t *testing.T) {
	q := reflect.ValueOf(newQueries(MySQL, "oncekit_"))
	checked := 0
	for i := range q.NumField() {
		f := q.Field(i)
		var stmts []string
		switch f.Kind() {
		case reflect.String:
			stmts = []string{f.String()}
		case reflect.Array:
			for j := range f.Len() {
				stmts = append(stmts, f.Index(j).String())
			}
		}
		for _, s := range stmts {
			if !strings.Contains(s, "?") {
				continue
			}
			checked++
			var want strings.Builder
			n := 0
			for _, r := range s {
				if r == '?' {
					n++
					want.WriteString("$" + strconv.Itoa(n))
					continue
				}
				want.WriteRune(r)
			}
			if got := rebind(s); got != want.String() {
				t.Errorf("rebind changed %s's %q to %q", q.Type().Field(i).Name, s, got)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d statements checked", checked)
	}
}
