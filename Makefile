# oncekit — see README.md.
SHELL := /bin/bash
GO    ?= go
STATICCHECK_VERSION ?= v0.8.2

.PHONY: run test bench services-up services-down lint

## run: the flash-sale demo on the embedded (in-process) driver
run:
	$(GO) run ./examples/inventory

## test: start the servers, run every test with -race, stop the servers
test:
	scripts/test.sh

## bench: benchmarks of oncekit and its peers on the same servers
bench:
	scripts/bench.sh

services-up:
	scripts/services.sh up
	@echo 'run: eval "$$(scripts/services.sh env)"'

services-down:
	scripts/services.sh down

lint:
	@unformatted=$$(gofmt -l . ); if [[ -n "$$unformatted" ]]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
