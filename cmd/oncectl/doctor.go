package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/oncekit/oncekit/core/lock"
)

// The verdicts of a promise on a deployment.
const (
	holds   = "holds"
	holdsIf = "holds if"
	fails   = "does not hold"
)

// The promises doctor judges: the README's guarantees table's columns.
const (
	promiseExclusion = "mutual exclusion"
	promiseFences    = "fences never go back"
	promiseOnce      = "runs once"
	promiseDeadFrees = "a dead holder frees the key"
	promiseRetry     = "a retry knows it"
)

// finding is one promise as this deployment keeps it: the verdict, the
// reason measured, and what to change when it is not a plain holds.
type finding struct {
	Promise string `json:"promise"`
	Verdict string `json:"verdict"`
	Why     string `json:"why"`
	Fix     string `json:"fix,omitempty"`
}

// fact is one setting or measurement a verdict rests on.
type fact struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// diagnosis is doctor's answer for one store.
type diagnosis struct {
	Store    string    `json:"store"`
	Facts    []fact    `json:"facts"`
	Findings []finding `json:"findings"`
}

func (d *diagnosis) fact(name, format string, args ...any) {
	d.Facts = append(d.Facts, fact{name, fmt.Sprintf(format, args...)})
}

// judge records promise's verdict: every condition that applies (worst
// first), or holds with why when none does. collapse makes them one line.
func (d *diagnosis) judge(promise, why string, conds ...finding) {
	found := false
	for _, c := range conds {
		if c.Verdict != "" {
			c.Promise = promise
			d.Findings = append(d.Findings, c)
			found = true
		}
	}
	if !found {
		d.Findings = append(d.Findings, finding{Promise: promise, Verdict: holds, Why: why})
	}
}

// rank orders verdicts, worst last.
func rank(v string) int {
	switch v {
	case fails:
		return 2
	case holdsIf:
		return 1
	}
	return 0
}

// collapse makes the findings one per promise, in their order: the worst
// verdict, with every distinct reason and fix of that verdict.
func collapse(fs []finding) []finding {
	var out []finding
	for _, f := range fs {
		i := slices.IndexFunc(out, func(g finding) bool { return g.Promise == f.Promise })
		switch {
		case i < 0:
			out = append(out, f)
		case rank(f.Verdict) > rank(out[i].Verdict):
			out[i] = f
		case rank(f.Verdict) == rank(out[i].Verdict) && f.Verdict != holds:
			if !strings.Contains(out[i].Why, f.Why) {
				out[i].Why += "; and " + f.Why
			}
			if f.Fix != "" && !strings.Contains(out[i].Fix, f.Fix) {
				out[i].Fix = strings.TrimPrefix(out[i].Fix+"; "+f.Fix, "; ")
			}
		}
	}
	return out
}

// when is a finding if ok is true, else none.
func when(ok bool, verdict, why, fix string) finding {
	if !ok {
		return finding{}
	}
	return finding{Verdict: verdict, Why: why, Fix: fix}
}

// doctor reads the settings the store's promises rest on and prints each
// promise's verdict for this deployment: exit 0 when every promise holds
// (perhaps on a condition it names), 1 when one does not, 2 when the store
// could not be reached.
func (c *cli) doctor() int {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var d *diagnosis
	st, err := openStore(c.storeURL, c.timeout)
	if err == nil {
		defer st.close()
		d, err = diagnose(ctx, st.store, c.storeURL, c.doctorTTL())
	}
	if err != nil && preparedStatementLost(err) {
		d, err = c.doctorUnpooled(ctx, err)
	}
	if err != nil {
		fmt.Fprintf(c.err, "oncectl: doctor: %v\n", err)
		return exitUsage
	}
	d.fact("TTL weighed against", "%v (--ttl)", c.doctorTTL())
	d.Store = redactURL(c.storeURL)
	d.Findings = collapse(d.Findings)
	if c.json {
		_ = json.NewEncoder(c.out).Encode(d)
	} else {
		d.print(c)
	}
	for _, f := range d.Findings {
		if f.Verdict == fails {
			return exitFail
		}
	}
	return exitOK
}

// doctorTTL is the TTL doctor weighs the store's timings against: --ttl,
// else lock.DefaultTTL.
func (c *cli) doctorTTL() time.Duration {
	if c.ttl > 0 {
		return c.ttl
	}
	return lock.DefaultTTL
}

// preparedStatementLost reports a PostgreSQL error of a named prepared
// statement a transaction pooler lent to another session (SQLSTATE 26000
// or 42P05).
func preparedStatementLost(err error) bool {
	m := err.Error()
	return strings.Contains(m, "prepared statement") && (strings.Contains(m, "26000") || strings.Contains(m, "42P05"))
}

// doctorUnpooled diagnoses a PostgreSQL URL whose statements failed
// through a transaction pooler again with the settings the pooler needs,
// and says that the URL as given does not work.
func (c *cli) doctorUnpooled(ctx context.Context, cause error) (*diagnosis, error) {
	u, err := url.Parse(c.storeURL)
	if err != nil {
		return nil, cause
	}
	q := u.Query()
	q.Set("notify", "false")
	q.Set("default_query_exec_mode", "exec")
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	st, err := openStore(u.String(), c.timeout)
	if err != nil {
		return nil, cause
	}
	defer st.close()
	d, err := diagnose(ctx, st.store, u.String(), c.doctorTTL())
	if err != nil {
		return nil, cause
	}
	f := finding{Verdict: fails,
		Why: "requests fail through the transaction pooler: " + cause.Error() + " (doctor read the rest with notify=false&default_query_exec_mode=exec)",
		Fix: "add notify=false&default_query_exec_mode=exec to the URL, as sqlstore's documentation says"}
	for _, p := range []string{promiseExclusion, promiseOnce, promiseDeadFrees, promiseRetry} {
		d.Findings = append(d.Findings, withPromise(f, p))
	}
	return d, nil
}

func (d *diagnosis) print(c *cli) {
	fmt.Fprintf(c.out, "%s\n\n", d.Store)
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	for _, f := range d.Facts {
		fmt.Fprintf(tw, "  %s\t%s\n", f.Name, f.Value)
	}
	tw.Flush()
	fmt.Fprintln(c.out)
	for _, f := range d.Findings {
		mark := "ok  "
		switch f.Verdict {
		case holdsIf:
			mark = "if  "
		case fails:
			mark = "FAIL"
		}
		fmt.Fprintf(c.out, "%s %s: %s — %s\n", mark, f.Promise, f.Verdict, f.Why)
		if f.Fix != "" {
			fmt.Fprintf(c.out, "     fix: %s\n", f.Fix)
		}
	}
}

// diagnose runs the checks of st's driver.
func diagnose(ctx context.Context, st any, rawURL string, ttl time.Duration) (*diagnosis, error) {
	switch s := st.(type) {
	case redisStore:
		return diagnoseRedis(ctx, s, rawURL, ttl)
	case redlockStore:
		return diagnoseRedlock(ctx, s, ttl)
	case etcdStore:
		return diagnoseEtcd(ctx, s, ttl)
	case zkStore:
		return diagnoseZK(ctx, s, rawURL, ttl)
	case sqlStore:
		return diagnoseSQL(ctx, s, rawURL)
	}
	return nil, fmt.Errorf("no checks for %T (doctor checks Redis, Sentinel, Cluster, Redlock, etcd, ZooKeeper, PostgreSQL and MySQL/MariaDB)", st)
}

// redactURL hides a URL's password.
func redactURL(raw string) string {
	if i := strings.Index(raw, "://"); i >= 0 {
		if at := strings.LastIndex(raw, "@"); at > i {
			if colon := strings.Index(raw[i+3:at], ":"); colon >= 0 {
				return raw[:i+3+colon] + ":xxxxx" + raw[at:]
			}
		}
	}
	return raw
}
