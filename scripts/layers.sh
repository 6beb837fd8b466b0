#!/usr/bin/env bash
# Checks that imports point down the layers users were promised, and that
# the example users copy builds outside this repository:
#
#   core  <-  storage/driver, storage/internal  <-  drivers  <-  storage/all
#   storage (Open) imports storage/driver and memstore only, so a program
#   links the drivers it imports (each registers its URL schemes)
#
# - core imports the standard library and core only (its conformance
#   suites, locktest and idemtest, also internal/childproc);
# - stock/stockdriver (what a store implements to keep stock) imports the
#   standard library only, so that drivers can implement it; stock imports
#   core and stock (stocktest also internal/childproc);
# - storage/driver (the contract and the scheme registry) imports core only;
# - storage/internal imports no driver, no storage, no middleware;
# - a driver imports no other driver, no storage, no middleware (only core,
#   storage/internal, storage/driver and stock/stockdriver);
# - storage (Open) imports core, storage/driver and memstore (memory:// is
#   always there), never another driver; storage/all imports the drivers;
# - the middleware (and job, lead) import no driver,
#   no storage and no other middleware (what they share is internal/mwcore);
# - nothing under examples/ imports an internal/ package, tests included.
# Test files, and the packages only tests import (kafkamw/internal/kafkatest),
# may import what their tests need (test servers, drivers), except under
# examples/. Every module of the repository is checked (scripts/workspace.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export GOWORK=${GOWORK:-$(scripts/workspace.sh)}
# shellcheck disable=SC2207
pkgs=($(scripts/workspace.sh --patterns))
mod=github.com/oncekit/oncekit
fail=0
bad() { echo "layers: $*" >&2; fail=1; }

while read -r pkg imports; do
	for imp in $imports; do
		case $imp in
		$mod/*) ;;
		*) [[ $pkg == $mod/core* && $imp == *.* ]] && bad "$pkg imports $imp (core imports only the standard library)"; continue ;;
		esac
		case $pkg in
		$mod/kafkamw/internal/kafkatest) ;;
		$mod/core/lock/locktest | $mod/core/idem/idemtest)
			[[ $imp == $mod/core* || $imp == $mod/internal/childproc ]] || bad "$pkg imports $imp (a core suite imports only core and internal/childproc)" ;;
		$mod/stock/stockdriver)
			bad "$pkg imports $imp (stock/stockdriver imports only the standard library)" ;;
		$mod/stock/stocktest)
			[[ $imp == $mod/core* || $imp == $mod/stock* || $imp == $mod/internal/childproc ]] || bad "$pkg imports $imp (stocktest imports only core, stock and internal/childproc)" ;;
		$mod/stock*)
			[[ $imp == $mod/core* || $imp == $mod/stock* ]] || bad "$pkg imports $imp (stock imports only core and itself)" ;;
		$mod/core*)
			[[ $imp == $mod/core* ]] || bad "$pkg imports $imp (core imports only core)" ;;
		$mod/storage/internal*)
			[[ $imp == $mod/core* || $imp == $mod/storage/internal* ]] || bad "$pkg imports $imp (storage/internal imports only core and itself)" ;;
		$mod/storage/driver)
			[[ $imp == $mod/core* ]] || bad "$pkg imports $imp (storage/driver imports only core)" ;;
		$mod/storage/*store)
			[[ $imp == $mod/core* || $imp == $mod/storage/internal* || $imp == $mod/storage/driver || $imp == $mod/stock/stockdriver ]] ||
				bad "$pkg imports $imp (a driver imports only core, storage/internal, storage/driver and stock/stockdriver)" ;;
		$mod/storage)
			[[ $imp == $mod/core* || $imp == $mod/storage/driver || $imp == $mod/storage/memstore ]] ||
				bad "$pkg imports $imp (storage imports only core, storage/driver and memstore: the others register themselves)" ;;
		$mod/storage/all)
			[[ $imp == $mod/storage/*store ]] || bad "$pkg imports $imp (storage/all imports only the drivers)" ;;
		$mod/httpmw* | $mod/grpcmw* | $mod/kafkamw* | $mod/job* | $mod/lead*)
			root=$(cut -d/ -f1-4 <<<"$pkg")
			[[ $imp == $mod/core* || $imp == $root || $imp == $root/* || $imp == $mod/internal/mwcore ]] ||
				bad "$pkg imports $imp (middleware imports only core, internal/mwcore and its own packages)" ;;
		esac
	done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}}' "${pkgs[@]}")

while read -r pkg imports; do
	[[ $pkg == $mod/examples/* ]] || continue
	for imp in $imports; do
		[[ $imp == */internal/* || $imp == */internal ]] && bad "$pkg imports $imp: examples/ must build outside this repository"
	done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}' "${pkgs[@]}")

[[ $fail == 0 ]] && echo "layers: ok"
exit $fail
