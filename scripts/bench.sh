#!/usr/bin/env bash
# make bench: start the servers, run oncekit's and the peers' benchmarks in
# one run on the same servers, stop the servers. BENCH (regexp), BENCH_TIME
# and BENCH_COUNT narrow or widen the run; DURABLE=1 runs the servers at
# durable settings (scripts/services.sh, ONCEKIT_DURABLE); the raw output is
# also written to bench/last-run.txt for benchstat.
set -uo pipefail
cd "$(dirname "$0")/.."

services=scripts/services.sh
baseline=$(mktemp -d)
trap '$services down; git worktree remove --force "$baseline/src" 2>/dev/null; rm -rf "$baseline"' EXIT
# The inventory service as it was before package stock (BASELINE_REF), for
# BenchmarkFlashSaleStock's baseline rows: built from a worktree of that
# commit, when the clone has it.
BASELINE_REF=${BASELINE_REF:-9cc66b9}
if git rev-parse -q --verify "$BASELINE_REF^{commit}" >/dev/null &&
	git worktree add -q --detach "$baseline/src" "$BASELINE_REF" &&
	(cd "$baseline/src/examples/inventory" && GOWORK=off go build -o "$baseline/inventory" ./cmd/inventory); then
	export INVENTORY_BASELINE=$baseline/inventory
fi
export ONCEKIT_DURABLE=${DURABLE:-}
$services up || exit 1
eval "$($services env)"
export ONCEKIT_REQUIRE_SERVERS=1
export GOWORK # every module but the benchmarks' own (scripts/workspace.sh)
GOWORK=$(scripts/workspace.sh)

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(go version)"
echo "# redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), durable settings: ${DURABLE:-no}"
(cd bench && GOWORK=off go test -run '^$' -bench "${BENCH:-.}" -benchtime "${BENCH_TIME:-2s}" -count "${BENCH_COUNT:-3}" ./...) \
	| tee bench/last-run.txt
rc=${PIPESTATUS[0]}
# The gRPC interceptor's own benchmark lives beside it (it uses the
# package's test service).
go test -run '^$' -bench "${BENCH:-.}" -benchtime "${BENCH_TIME:-2s}" -count "${BENCH_COUNT:-3}" ./grpcmw/ \
	| tee -a bench/last-run.txt
rc=$(( rc || PIPESTATUS[0] ))
# The Kafka runner against a bare kafka-go loop, on the services' broker: a
# fixed message count (each run produces its messages first).
go test -run '^$' -bench "${BENCH:-.}" -benchtime "${KAFKA_BENCH_MESSAGES:-20000}x" -count "${BENCH_COUNT:-3}" ./kafkamw/ \
	| tee -a bench/last-run.txt
rc=$(( rc || PIPESTATUS[0] ))
# The flash sale across three replica processes, locked and lock-free.
go test -run '^$' -bench "${BENCH:-.}" -benchtime "${FLASH_BUYERS:-2000}x" -count "${BENCH_COUNT:-3}" ./integration/ \
	| tee -a bench/last-run.txt
exit $(( rc || PIPESTATUS[0] ))
