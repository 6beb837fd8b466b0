#!/usr/bin/env bash
# Prints the path of a Go workspace (go.work) that holds every module of
# this repository but the benchmarks' — the main module, the adapters with
# heavy dependencies (observe/otelobs, observe/promobs, job/gocronjob,
# kafkamw/franz, kafkamw/kafkamwtest), cmd/kfake, examples/inventory and
# integration — or, with --patterns, the package patterns that name them
# all, so that one `go test` or `go vet` covers them, as `make test` and
# `make lint` do:
#
#	GOWORK=$(scripts/workspace.sh) go test $(scripts/workspace.sh --patterns)
#
# The file is written outside the tree, so a go.work of your own is left
# alone. Each module also builds on its own (its go.mod's replace lines).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
modules=$(cd "$root" && find . -name go.mod -not -path './bench/*' -not -path '*/_*' -not -path '*/testdata/*' -printf '%h\n' | sort)
if [[ ${1:-} == --patterns ]]; then
	# The integration scenarios first: the longest package, so that
	# `go test -p N` starts it at once rather than after everything else.
	for m in ./integration $(grep -vx './integration' <<<"$modules"); do printf '%s/... ' "$m"; done
	echo
	exit 0
fi
dir=${TMPDIR:-/tmp}/oncekit-work-$(printf %s "$root" | cksum | cut -d' ' -f1)
mkdir -p "$dir"
{
	echo "go 1.26.0"
	echo
	echo "use ("
	for m in $modules; do m=${m#.}; echo "	$root$m"; done
	echo ")"
} >"$dir/go.work.new"
mv "$dir/go.work.new" "$dir/go.work"
echo "$dir/go.work"
