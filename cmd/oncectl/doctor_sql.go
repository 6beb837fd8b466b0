package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/oncekit/oncekit/storage/sqlstore"
)

// sqlStore is a sqlstore Store (doctor reads its database).
type sqlStore interface {
	DB() *sql.DB
	Dialect() sqlstore.Dialect
	CheckLayout(ctx context.Context) error
}

// diagnoseSQL judges a PostgreSQL or MySQL/MariaDB database: how a commit
// reaches the disk, the schema's layout, a transaction pooler.
func diagnoseSQL(ctx context.Context, s sqlStore, rawURL string) (*diagnosis, error) {
	d := &diagnosis{}
	db := s.DB()
	var version string
	if err := db.QueryRowContext(ctx, "SELECT version()").Scan(&version); err != nil {
		return nil, err
	}
	d.fact("version", "%s", strings.SplitN(version, " on ", 2)[0])
	layout := "in place"
	if err := s.CheckLayout(ctx); err != nil {
		layout = err.Error()
	}
	d.fact("schema", "%s", layout)
	offset, err := sqlFacts(ctx, d, db, s.Dialect())
	if err != nil {
		return nil, err
	}
	clock := when(offset.Abs() > time.Minute, holdsIf, fmt.Sprintf("the server's clock does not step back: it is %v from this machine's", offset.Round(time.Second)), "run NTP on the server")
	var lose []finding
	const why = "a run's record and its effect commit in one transaction"
	if s.Dialect() == sqlstore.Postgres {
		var fsync, syncCommit, pids string
		if err := db.QueryRowContext(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &syncCommit); err != nil {
			return nil, err
		}
		pooled, err := pgPooled(ctx, db)
		if err != nil {
			return nil, err
		}
		if pooled {
			pids = "transaction pooling (a pooler such as pgbouncer: sessions change between statements)"
		} else {
			pids = "none seen"
		}
		d.fact("fsync / synchronous_commit", "%s / %s", fsync, syncCommit)
		d.fact("pooler", "%s", pids)
		lose = []finding{
			when(fsync == "off", holdsIf, "the machine does not crash: fsync is off, and an operating-system crash or a power loss can lose or corrupt committed records and locks (a crash of the server process alone loses nothing)", "fsync = on"),
			when(syncCommit == "off", holdsIf, "the server does not crash: synchronous_commit = off acknowledges a commit before it is on disk, and a crash loses the last ones", "synchronous_commit = on (for oncekit's role: ALTER ROLE … SET synchronous_commit = on)"),
		}
		q := url.Values{}
		if u, err := url.Parse(rawURL); err == nil {
			q = u.Query()
		}
		named := pooled && q.Get("default_query_exec_mode") != "exec" && q.Get("default_query_exec_mode") != "simple_protocol"
		listen := pooled && q.Get("notify") != "false"
		d.judge(promiseExclusion, "row locks, the server's clock", append(lose,
			when(named, holdsIf, "requests get through the transaction pooler: pgx's named prepared statements fail when the pooler lends the next statement another server session, unless it keeps them (pgbouncer 1.21 or later with max_prepared_statements)", "add default_query_exec_mode=exec to the URL, as sqlstore's documentation says"),
			when(listen, holdsIf, "waiters are woken through the transaction pooler: LISTEN runs on a session the pooler lends for one statement, so wake-ups go astray (a waiter waits up to a second per look)", "add notify=false to the URL, as sqlstore's documentation says"))...)
	} else {
		var flush, binlog, syncBinlog string
		if err := db.QueryRowContext(ctx, "SELECT @@innodb_flush_log_at_trx_commit, @@log_bin, @@sync_binlog").Scan(&flush, &binlog, &syncBinlog); err != nil {
			return nil, err
		}
		d.fact("innodb_flush_log_at_trx_commit / log_bin / sync_binlog", "%s / %s / %s", flush, binlog, syncBinlog)
		lose = []finding{
			when(flush != "1", holdsIf, fmt.Sprintf("the machine does not crash: innodb_flush_log_at_trx_commit = %s writes the log to disk about once a second, and a crash loses the last commits", flush), "innodb_flush_log_at_trx_commit = 1"),
			when(binlog == "1" && syncBinlog != "1", holdsIf, "a replica promoted after a crash has the last commits: sync_binlog ≠ 1 can lose them from the binary log", "sync_binlog = 1"),
		}
		d.judge(promiseExclusion, "row locks, the server's clock", lose...)
	}
	d.judge(promiseFences, "each fence is at least the server's clock in µs, and rows are kept until the clock has passed their fence", clock)
	d.judge(promiseOnce, why, lose...)
	d.judge(promiseDeadFrees, "a lease's row expires by the server's clock")
	d.judge(promiseRetry, "attempts are counted in the record's row", lose...)
	if layout != "in place" {
		d.Findings = append(d.Findings, finding{Promise: "schema", Verdict: fails, Why: layout, Fix: "run Store.Migrate (or storage.Open with migrate=true) with this version"})
	}
	return d, nil
}

// pgPooled reports whether statements outside a transaction reach server
// sessions that are not their client connection's own: a transaction
// pooler (pgbouncer's pool_mode = transaction) between this process and
// the server. While x holds a backend in a transaction, y runs a
// statement; x commits, releasing its backend last, and y runs another: a
// pooler hands y the backend released last (x's), while a direct or
// session-pooled connection keeps y on its own.
func pgPooled(ctx context.Context, db *sql.DB) (bool, error) {
	// Each probe may miss (a pooler with idle backends to spare); none
	// can see a pooler that is not there: a few probes, any one decides.
	for range 5 {
		if pooled, err := pgPoolProbe(ctx, db); err != nil || pooled {
			return pooled, err
		}
	}
	return false, nil
}

// pgPoolProbe is one probe of pgPooled.
func pgPoolProbe(ctx context.Context, db *sql.DB) (bool, error) {
	x, err := db.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer x.Close()
	y, err := db.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer y.Close()
	pid := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) (int, error) {
		var p int
		err := q.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&p)
		return p, err
	}
	tx, err := x.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := pid(tx); err != nil {
		return false, err
	}
	before, err := pid(y)
	if err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, err
	}
	after, err := pid(y)
	return err == nil && after != before, err
}

// sqlFacts adds the default isolation, the time zone, the connections in
// use against the limit, and the server's clock against this machine's,
// which it returns.
func sqlFacts(ctx context.Context, d *diagnosis, db *sql.DB, dialect sqlstore.Dialect) (time.Duration, error) {
	var iso, tz, maxConns string
	var used int
	var us int64
	start := time.Now()
	var err error
	if dialect == sqlstore.Postgres {
		err = db.QueryRowContext(ctx, `SELECT current_setting('default_transaction_isolation'), current_setting('TimeZone'),
			current_setting('max_connections'), (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),
			(extract(epoch FROM clock_timestamp()) * 1000000)::bigint`).Scan(&iso, &tz, &maxConns, &used, &us)
	} else {
		// MySQL 8 names the isolation transaction_isolation; MariaDB
		// before 11.1 only tx_isolation.
		if db.QueryRowContext(ctx, "SELECT @@transaction_isolation").Scan(&iso) != nil {
			if err := db.QueryRowContext(ctx, "SELECT @@tx_isolation").Scan(&iso); err != nil {
				return 0, err
			}
		}
		start = time.Now()
		err = db.QueryRowContext(ctx, `SELECT CONCAT(@@time_zone, ' (system ', @@system_time_zone, ')'),
			@@max_connections, (SELECT COUNT(*) FROM information_schema.PROCESSLIST), CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)`).Scan(&tz, &maxConns, &used, &us)
	}
	if err != nil {
		return 0, err
	}
	rtt := time.Since(start)
	offset := time.UnixMicro(us).Sub(start.Add(rtt / 2))
	note := "oncekit's transactions use locking reads at it"
	if dialect == sqlstore.Postgres {
		note = "oncekit's own transactions run at read committed, as must yours that complete a claim (sqlstore.Effect)"
	}
	d.fact("default isolation / time zone", "%s / %s (%s; times are kept as µs since the epoch, whatever the zone)", iso, tz, note)
	d.fact("connections in use / limit", "%d / %s", used, maxConns)
	d.fact("clock offset (server − this machine)", "%v", offset.Round(time.Millisecond))
	return offset, nil
}
