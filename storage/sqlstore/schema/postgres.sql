-- oncekit's tables on PostgreSQL. {prefix} is the table prefix
-- (sqlstore.WithTablePrefix, default "oncekit_"), {index} the same without
-- its schema (an index lives in its table's). Keys, owners and
-- fingerprints are bytes: any Go string, compared byte for byte.
-- Times are microseconds since the Unix epoch by the server's clock.
-- Each table's comment names its layout ("oncekit layout 1": oncekit
-- v0.1.0's), which Migrate and Open check (at the end of this file).

CREATE TABLE IF NOT EXISTS {prefix}locks (
	lock_key   bytea  PRIMARY KEY,
	token      text   NOT NULL, -- '' while free (a tombstone that keeps the fence)
	owner      bytea  NOT NULL,
	holds      integer NOT NULL,
	fence      bigint NOT NULL,
	expires_us bigint NOT NULL,
	queued     boolean NOT NULL DEFAULT false -- waiters may be queued in lock_waiters (see queue.go)
) WITH (fillfactor = 50);
-- No index on expires_us: every acquisition and release changes it, and an
-- indexed column makes each of those updates write new index entries
-- instead of a heap-only (HOT) update — on a hot key, half the throughput.
-- The cleanup scans the table instead (it holds the keys locked or freed
-- in the last minute or so). Tables made before this dropped their index:
DROP INDEX IF EXISTS {prefix}locks_expires;

CREATE TABLE IF NOT EXISTS {prefix}lock_waiters (
	lock_key   bytea  NOT NULL,
	waiter     text   NOT NULL,
	seq        bigint NOT NULL,
	expires_us bigint NOT NULL,
	PRIMARY KEY (lock_key, waiter)
);
CREATE INDEX IF NOT EXISTS {index}lock_waiters_seq ON {prefix}lock_waiters (lock_key, seq);
CREATE INDEX IF NOT EXISTS {index}lock_waiters_expires ON {prefix}lock_waiters (expires_us);

CREATE TABLE IF NOT EXISTS {prefix}records (
	record_key  bytea    PRIMARY KEY,
	state       smallint NOT NULL, -- 0 free (tombstone), 1 in flight, 2 completed
	fingerprint bytea    NOT NULL,
	token       text     NOT NULL,
	fence       bigint   NOT NULL,
	expires_us  bigint   NOT NULL,
	result      bytea,
	watched     boolean  NOT NULL DEFAULT false, -- a duplicate waits for it: its finish sends NOTIFY
	attempt     integer  NOT NULL DEFAULT 0, -- the last claim's number among those that did not complete
	sweep_us    bigint   NOT NULL DEFAULT 0 -- when the cleanup looks at the row next (see below)
);
-- The cleanup finds rows by sweep_us, not by expires_us: a claim writes it
-- once, as the time its record is likely to be deletable (its lease plus
-- the retention its Store saw last, at most a day), and nothing else on
-- the request path does — a completion, which changes expires_us, stays a
-- heap-only (HOT) update that writes no index entry. The cleanup deletes the rows past
-- sweep_us that may go, and sets sweep_us of the others to the time they
-- may (a retention longer than guessed, a claim that came back). Tables
-- made before this get the column (Migrate) and lose their expiry index:
CREATE INDEX IF NOT EXISTS {index}records_sweep ON {prefix}records (sweep_us);
DROP INDEX IF EXISTS {prefix}records_expires;

-- Stock (package stock): one row per item, and one per key that took or
-- held units of it. Times are milliseconds by the server's clock. kind is
-- stockdriver.Kind (1 take, 2 hold), state stockdriver.State (1 sold,
-- 2 held, 3 sold out, 4 released, 5 expired).
CREATE TABLE IF NOT EXISTS {prefix}stock_items (
	item bytea  PRIMARY KEY,
	put  bigint NOT NULL,
	free bigint NOT NULL,
	held bigint NOT NULL,
	sold bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS {prefix}stock_records (
	item        bytea    NOT NULL,
	take_key    bytea    NOT NULL,
	kind        smallint NOT NULL,
	state       smallint NOT NULL,
	units       bigint   NOT NULL,
	deadline_ms bigint   NOT NULL, -- when a hold ends
	until_ms    bigint   NOT NULL, -- when the record may be forgotten (not while held)
	keep_ms     bigint   NOT NULL, -- how long it is kept after its hold ends
	PRIMARY KEY (item, take_key)
);
CREATE INDEX IF NOT EXISTS {index}stock_records_held ON {prefix}stock_records (item, deadline_ms) WHERE state = 2;
CREATE INDEX IF NOT EXISTS {index}stock_records_until ON {prefix}stock_records (until_ms);

COMMENT ON TABLE {prefix}locks IS 'oncekit layout 1';
COMMENT ON TABLE {prefix}lock_waiters IS 'oncekit layout 1';
COMMENT ON TABLE {prefix}records IS 'oncekit layout 1';
COMMENT ON TABLE {prefix}stock_items IS 'oncekit layout 1';
COMMENT ON TABLE {prefix}stock_records IS 'oncekit layout 1';
