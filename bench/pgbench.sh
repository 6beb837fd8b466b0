#!/usr/bin/env bash
# bench/pgbench.sh: what a new-key lock cycle costs PostgreSQL itself, with
# no Go client in the way: pgbench runs each pair of statements (take,
# release) on a new key per cycle, 16 connections, prepared. It shows how
# much of sqlstore's gap to the seed lock (BenchmarkSQLLock/postgres/new-key)
# is the server's work for the guarantees, and how much each part costs.
#
#   scripts/services.sh up && eval "$(scripts/services.sh env)"
#   bench/pgbench.sh            # PGBENCH_TIME (8 s) per case, PGBENCH_ROUNDS (2), PGBENCH_CASES (all)
#
# The cases, in scratch tables (pgbench_oncekit_*, dropped at the end):
#   seed            the seed lock: INSERT (key, owner), DELETE by key and owner
#   oncekit         sqlstore's take (an upsert that reads the server's clock
#                   for the fence and takes the key's session lock, the
#                   server's queue) and release (the row freed, kept as the
#                   fence's tombstone, and the session lock given back):
#                   queue.go's sqTry and sqRelease
#   no-queue        the same without the session lock
#   insert-update   a plain INSERT (no ON CONFLICT) and the tombstone UPDATE
#   insert-delete   a plain INSERT and a DELETE: what dropping the tombstone
#                   would leave (it would let a fence go backwards: see
#                   cleanupGrace in storage/sqlstore/dialect.go)
#   row-shape       the seed lock's statements on sqlstore's row (seven
#                   columns, a bytea key), constants for the fence and
#                   expiry: what the row alone costs
#   floor           the least a lock with a fence and an expiry by the
#                   server's clock can run in one statement each way: an
#                   upsert that reads the clock (a free or expired row is
#                   taken over in the same statement) and a DELETE; no
#                   tombstone, no queue
set -euo pipefail
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
: "${POSTGRES_URL:?run eval \"\$(scripts/services.sh env)\" first}"
time=${PGBENCH_TIME:-8}
rounds=${PGBENCH_ROUNDS:-2}
dir=$(mktemp -d)
trap 'rm -rf "$dir"; psql "$POSTGRES_URL" -qc "DROP TABLE IF EXISTS pgbench_oncekit_locks, pgbench_oncekit_seed" >/dev/null 2>&1' EXIT

psql "$POSTGRES_URL" -q <<'SQL'
DROP TABLE IF EXISTS pgbench_oncekit_locks, pgbench_oncekit_seed;
CREATE TABLE pgbench_oncekit_locks (lock_key bytea PRIMARY KEY, token text NOT NULL, owner bytea NOT NULL,
  holds integer NOT NULL, fence bigint NOT NULL, expires_us bigint NOT NULL, queued boolean NOT NULL DEFAULT false)
  WITH (fillfactor = 50);
CREATE TABLE pgbench_oncekit_seed (k text PRIMARY KEY, owner text NOT NULL);
SQL

now="CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)"
key="convert_to('bench-key-' || CAST(:k AS text) || '-' || CAST(:client_id AS text), 'UTF8')"
tok="'tok-' || CAST(:client_id AS text) || '-abcdefghijklmnop'"
set_k='\set k random(1, 1000000000000000)'
take="INSERT INTO pgbench_oncekit_locks AS l (lock_key, token, owner, holds, fence, expires_us)
  SELECT $key, $tok, ''::bytea, 1, n.now, n.now + 10000000 FROM (SELECT $now AS now) n"
upsert=" ON CONFLICT (lock_key) DO UPDATE SET token = EXCLUDED.token, owner = EXCLUDED.owner, holds = 1,
  fence = GREATEST(l.fence + 1, $now), expires_us = $now + 10000000
  WHERE (l.token = '' OR l.expires_us <= $now) AND NOT l.queued"
free="UPDATE pgbench_oncekit_locks SET token = '', owner = ''::bytea, holds = 0, expires_us = $now
  WHERE lock_key = $key AND token = $tok AND holds = 1 AND expires_us > $now"
waited="expires_us - 10000000 - CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)"

printf '%s\n%s\n%s\n' "$set_k" \
	"INSERT INTO pgbench_oncekit_seed (k, owner) VALUES ('bench-key-' || CAST(:k AS text) || '-' || CAST(:client_id AS text), 'owner');" \
	"DELETE FROM pgbench_oncekit_seed WHERE k = 'bench-key-' || CAST(:k AS text) || '-' || CAST(:client_id AS text) AND owner = 'owner';" >"$dir/seed.sql"
printf '%s\n%s\n%s\n' "$set_k" "$take$upsert RETURNING fence, pg_try_advisory_lock(:k), $waited;" \
	"$free RETURNING pg_advisory_unlock(:k), queued;" >"$dir/oncekit.sql"
printf '%s\n%s\n%s\n' "$set_k" "$take$upsert RETURNING fence;" "$free RETURNING queued;" >"$dir/no-queue.sql"
printf '%s\n%s\n%s\n' "$set_k" "$take RETURNING fence;" "$free;" >"$dir/insert-update.sql"
printf '%s\n%s\n%s\n' "$set_k" "$take RETURNING fence;" \
	"DELETE FROM pgbench_oncekit_locks WHERE lock_key = $key AND token = $tok;" >"$dir/insert-delete.sql"
printf '%s\n%s\n%s\n' "$set_k" \
	"INSERT INTO pgbench_oncekit_locks (lock_key, token, owner, holds, fence, expires_us) VALUES ($key, $tok, ''::bytea, 1, 5, 10);" \
	"DELETE FROM pgbench_oncekit_locks WHERE lock_key = $key AND token = $tok;" >"$dir/row-shape.sql"
printf '%s\n%s\n%s\n' "$set_k" \
	"INSERT INTO pgbench_oncekit_locks AS l (lock_key, token, owner, holds, fence, expires_us) VALUES ($key, $tok, ''::bytea, 1, $now, $now + 10000000)
  ON CONFLICT (lock_key) DO UPDATE SET token = EXCLUDED.token, owner = EXCLUDED.owner, holds = 1,
  fence = GREATEST(l.fence + 1, $now), expires_us = $now + 10000000 WHERE l.expires_us <= $now RETURNING fence;" \
	"DELETE FROM pgbench_oncekit_locks WHERE lock_key = $key AND token = $tok;" >"$dir/floor.sql"

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(psql "$POSTGRES_URL" -Atc 'SHOW server_version'), pgbench -M prepared -c 16 -j 2 -T $time"
for round in $(seq "$rounds"); do
	for c in ${PGBENCH_CASES:-seed oncekit no-queue insert-update insert-delete row-shape floor}; do
		psql "$POSTGRES_URL" -qc "TRUNCATE pgbench_oncekit_locks, pgbench_oncekit_seed"
		tps=$(pgbench -n -M prepared -c 16 -j 2 -T "$time" -f "$dir/$c.sql" "$POSTGRES_URL" 2>&1 |
			sed -n 's/^tps = \([0-9.]*\).*/\1/p')
		printf 'round %d  %-14s %8.0f cycles/s\n' "$round" "$c" "${tps:-0}"
	done
done
