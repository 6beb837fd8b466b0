# oncekit — see README.md.
SHELL := /bin/bash
GO    ?= go
STATICCHECK_VERSION ?= v0.8.2

.PHONY: run test bench fuzz soak services-up services-down lint proto demo-redis demo-redlock demo-etcd

## run: the flash-sale demo: three replicas of the inventory service in one
## process on the embedded store and an embedded Kafka-protocol broker, and a
## flash sale against them
run:
	cd examples/inventory && $(GO) run ./cmd/inventory --demo

## demo-redis, demo-redlock, demo-etcd: the same demo on the servers of
## `make services-up`
REDIS_ADDRS ?= 127.0.0.1:6379,127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382,127.0.0.1:6383
ETCD_ENDPOINTS ?= 127.0.0.1:2379
KAFKA_BROKERS ?= 127.0.0.1:9092
demo-redis:
	cd examples/inventory && $(GO) run ./cmd/inventory --demo --store redis://$(firstword $(subst $(comma), ,$(REDIS_ADDRS))) --kafka $(KAFKA_BROKERS)
demo-redlock:
	cd examples/inventory && $(GO) run ./cmd/inventory --demo --store redlock://$(REDIS_ADDRS) --kafka $(KAFKA_BROKERS)
demo-etcd:
	cd examples/inventory && $(GO) run ./cmd/inventory --demo --store etcd://$(ETCD_ENDPOINTS) --kafka $(KAFKA_BROKERS)
comma := ,

## test: start the servers, run every test with -race, stop the servers
test:
	scripts/test.sh

## bench: benchmarks of oncekit and its peers on the same servers
bench:
	scripts/bench.sh

## soak: flash sales for SOAK (default 10m) against three replica processes
## with a fault every 30 s (not part of make test)
SOAK ?= 10m
soak:
	scripts/services.sh up
	eval "$$(scripts/services.sh env)"; cd integration && ONCEKIT_REQUIRE_SERVERS=1 ONCEKIT_SOAK=$(SOAK) $(GO) test -tags soak -count=1 -v -timeout 0 -run '^TestSoak$$' .; rc=$$?; scripts/services.sh down; exit $$rc

## fuzz: every fuzz target for FUZZTIME (default 30s) each, on the real servers
fuzz:
	scripts/fuzz.sh

services-up:
	scripts/services.sh up
	@echo 'run: eval "$$(scripts/services.sh env)"'

services-down:
	scripts/services.sh down

## lint: gofmt, vet, the layers and staticcheck over every module (one
## workspace: scripts/workspace.sh)
lint:
	@unformatted=$$(gofmt -l . ); if [[ -n "$$unformatted" ]]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	export GOWORK=$$(scripts/workspace.sh); pkgs=$$(scripts/workspace.sh --patterns); $(GO) vet $$pkgs && scripts/layers.sh && \
		$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $$pkgs
	cd bench && GOWORK=off $(GO) vet ./...

## proto: regenerate the committed gRPC code (grpcmw's test service, the inventory API) (protoc from Debian's
## protobuf-compiler, the Go plugins from the module proxy)
PROTOC_GEN_GO_VERSION ?= v1.36.12
PROTOC_GEN_GO_GRPC_VERSION ?= v1.6.2
proto:
	@command -v protoc >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends protobuf-compiler >/dev/null)
	GOBIN=$(CURDIR)/.bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(CURDIR)/.bin $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	cd grpcmw/internal/testpb && protoc --proto_path=. \
		--plugin=protoc-gen-go=$(CURDIR)/.bin/protoc-gen-go --plugin=protoc-gen-go-grpc=$(CURDIR)/.bin/protoc-gen-go-grpc \
		--go_out=paths=source_relative:. --go-grpc_out=paths=source_relative:. test.proto
	cd examples/inventory/inventorypb && protoc --proto_path=. \
		--plugin=protoc-gen-go=$(CURDIR)/.bin/protoc-gen-go --plugin=protoc-gen-go-grpc=$(CURDIR)/.bin/protoc-gen-go-grpc \
		--go_out=paths=source_relative:. --go-grpc_out=paths=source_relative:. inventory.proto
