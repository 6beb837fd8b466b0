-- oncekit's tables on MySQL 8 and MariaDB 10.6+. {prefix} is the table
-- prefix (sqlstore.WithTablePrefix, default "oncekit_"), {index} the same
-- without its schema (an index lives in its table's). Keys, owners and
-- fingerprints are binary: any Go string, compared byte for byte (never by
-- a case-insensitive collation). Times are microseconds since the Unix
-- epoch by the server's clock. Each table's comment names its layout
-- ("oncekit layout 1": oncekit v0.1.0's), which Migrate and Open check.

CREATE TABLE IF NOT EXISTS {prefix}locks (
	lock_key   VARBINARY(512) NOT NULL PRIMARY KEY,
	token      VARBINARY(64)  NOT NULL, -- '' while free (a tombstone that keeps the fence)
	owner      VARBINARY(256) NOT NULL,
	holds      INT            NOT NULL,
	fence      BIGINT         NOT NULL,
	expires_us BIGINT         NOT NULL,
	queued     BOOLEAN        NOT NULL DEFAULT FALSE -- waiters may be queued in lock_waiters (see queue.go)
) ENGINE = InnoDB COMMENT = 'oncekit layout 1';
-- No index on expires_us: every acquisition and release changes it, and on
-- a new key its index entries cost the server a third of the cycle. The
-- cleanup scans the table instead (it holds the keys locked or freed in
-- the last minute or so), with a read that takes no lock, and deletes
-- what it found by key. Migrate drops the index of tables made before.

CREATE TABLE IF NOT EXISTS {prefix}lock_waiters (
	lock_key   VARBINARY(512) NOT NULL,
	waiter     VARBINARY(64)  NOT NULL,
	seq        BIGINT         NOT NULL,
	expires_us BIGINT         NOT NULL,
	PRIMARY KEY (lock_key, waiter),
	INDEX {index}lock_waiters_seq (lock_key, seq),
	INDEX {index}lock_waiters_expires (expires_us)
) ENGINE = InnoDB COMMENT = 'oncekit layout 1';

CREATE TABLE IF NOT EXISTS {prefix}records (
	record_key  VARBINARY(512) NOT NULL PRIMARY KEY,
	state       SMALLINT       NOT NULL, -- 0 free (tombstone), 1 in flight, 2 completed
	fingerprint BLOB           NOT NULL,
	token       VARBINARY(64)  NOT NULL,
	fence       BIGINT         NOT NULL,
	expires_us  BIGINT         NOT NULL,
	result      LONGBLOB,
	attempt     INT            NOT NULL DEFAULT 0, -- the last claim's number among those that did not complete
	sweep_us    BIGINT         NOT NULL DEFAULT 0, -- when the cleanup looks at the row next
	INDEX {index}records_sweep (sweep_us)
) ENGINE = InnoDB COMMENT = 'oncekit layout 1';
-- The cleanup finds rows by sweep_us, not by expires_us: a claim writes it
-- once, as the time its record is likely to be deletable (its lease plus
-- the retention its Store saw last, at most a day), and a completion,
-- which changes expires_us, writes no index entry. The cleanup deletes the
-- rows past sweep_us that may go and sets sweep_us of the others to the
-- time they may. Migrate adds the column and index to tables made before, and drops
-- their expiry index.

-- Stock (package stock): one row per item, and one per key that took or
-- held units of it. Times are milliseconds by the server's clock. kind is
-- stockdriver.Kind (1 take, 2 hold), state stockdriver.State (1 sold,
-- 2 held, 3 sold out, 4 released, 5 expired).
CREATE TABLE IF NOT EXISTS {prefix}stock_items (
	item VARBINARY(512) NOT NULL PRIMARY KEY,
	put  BIGINT         NOT NULL,
	free BIGINT         NOT NULL,
	held BIGINT         NOT NULL,
	sold BIGINT         NOT NULL
) ENGINE = InnoDB COMMENT = 'oncekit layout 1';
CREATE TABLE IF NOT EXISTS {prefix}stock_records (
	item        VARBINARY(512) NOT NULL,
	take_key    VARBINARY(512) NOT NULL,
	kind        SMALLINT       NOT NULL,
	state       SMALLINT       NOT NULL,
	units       BIGINT         NOT NULL,
	deadline_ms BIGINT         NOT NULL, -- when a hold ends
	until_ms    BIGINT         NOT NULL, -- when the record may be forgotten (not while held)
	keep_ms     BIGINT         NOT NULL, -- how long it is kept after its hold ends
	PRIMARY KEY (item, take_key),
	INDEX {index}stock_records_held (item, state, deadline_ms),
	INDEX {index}stock_records_until (until_ms)
) ENGINE = InnoDB COMMENT = 'oncekit layout 1';
