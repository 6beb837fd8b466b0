#!/usr/bin/env bash
# make test: start every server the tests need, check formatting and vet,
# run all tests under the race detector with servers required (a missing
# server fails, never skips), and stop the servers again, also when
# something fails.
set -uo pipefail
cd "$(dirname "$0")/.."

services=scripts/services.sh
trap '$services down' EXIT
$services up || exit 1
eval "$($services env)"
export ONCEKIT_REQUIRE_SERVERS=1

# Every module of the repository but the benchmarks' in one workspace
# (scripts/workspace.sh): one `go test` covers them all.
export GOWORK
GOWORK=$(scripts/workspace.sh)
pkgs=$(scripts/workspace.sh --patterns)

rc=0
# Each module's go.mod and go.sum say what it needs, as its users build it
# (outside the workspace).
for m in $(find . -name go.mod -not -path '*/_*' -printf '%h\n' | sort); do
	(cd "$m" && GOWORK=off go mod tidy -diff >/dev/null) || { echo "go mod tidy needed in $m"; rc=1; }
done
# Formatting and vet first: cheap, and what a reviewer would flag.
unformatted=$(gofmt -l .)
if [[ -n "$unformatted" ]]; then echo "gofmt needed:"; echo "$unformatted"; rc=1; fi
go vet $pkgs || rc=1
# Imports point down the layers, and examples/ builds outside this repository.
scripts/layers.sh || rc=1
(cd bench && GOWORK=off go vet ./...) || rc=1
# Most tests wait on servers (leases running out, restarts, elections),
# not on the CPU: three packages at a time, and up to four parallel tests
# in each (the conformance suites' configurations), keep the two cores
# busy. The integration scenarios, and tests that bound a time, run alone.
log=$(mktemp)
trap '$services down; rm -f "$log"' EXIT
start=$SECONDS
go test -race -count=1 -timeout 30m -p 3 -parallel 4 $pkgs 2>&1 | tee "$log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
race=$((SECONDS - start))
# The first command a Go developer types, with no server configured:
# every server-backed test must skip with its reason, and everything else
# pass. (-short: the tests that start servers of their own, to kill and
# restart them, ran above; here they would only run again.)
env -u REDIS_ADDRS -u REDIS_CLUSTER_ADDRS -u REDIS_SENTINEL_ADDRS -u ETCD_ENDPOINTS -u KAFKA_BROKERS -u POSTGRES_URL -u MYSQL_URL -u ZOOKEEPER_ADDRS -u PGBOUNCER_URL -u ONCEKIT_REQUIRE_SERVERS \
	go test -short -count=1 $pkgs || rc=1
# The benchmark module (peer libraries live there, out of the main go.mod):
# each benchmark runs once so it cannot rot.
(cd bench && GOWORK=off go test -count=1 -run '^$' -bench . -benchtime 1x ./...) || rc=1
go test -count=1 -run '^$' -bench . -benchtime 1x ./grpcmw/ ./kafkamw/ ./integration/ || rc=1
# Where the time went: the race run's slowest packages.
echo "make test: the race run took ${race}s, all ${SECONDS}s; its slowest packages:"
awk '$1 == "ok" || $1 == "FAIL" { if ($3 ~ /s$/) { t = $3; sub(/s$/, "", t); print t "s\t" $2 } }' "$log" | sort -rn | head -10
exit $rc
