#!/usr/bin/env bash
# make fuzz: start the servers, run every fuzz target for FUZZTIME (default
# 30s) each, stop the servers. A failure leaves its input in the package's
# testdata/fuzz/<Target>/, where `go test` replays it from then on.
set -uo pipefail
cd "$(dirname "$0")/.."

services=scripts/services.sh
trap '$services down' EXIT
$services up || exit 1
eval "$($services env)"
export ONCEKIT_REQUIRE_SERVERS=1

targets=(
	"./httpmw FuzzParseKey"          # Idempotency-Key parsing
	"./httpmw FuzzDecodeResponse"    # stored HTTP responses
	"./grpcmw FuzzDecodeOutcome"     # stored gRPC replies and statuses
	"./kafkamw FuzzKeyOf"            # Kafka key extraction
	"./storage/redisstore FuzzCorruptRecord" # records planted in Redis
	"./storage/etcdstore FuzzCorruptRecord"  # records planted in etcd
)
rc=0
for t in "${targets[@]}"; do
	read -r pkg name _ <<<"$t"
	echo "== $pkg $name (${FUZZTIME:-30s})"
	go test -run '^$' -fuzz "^${name}\$" -fuzztime "${FUZZTIME:-30s}" "$pkg" || rc=1
done
exit $rc
