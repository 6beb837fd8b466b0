// Command inventory runs the inventory example: the flash-sale service
// (HTTP, gRPC, Kafka) on any oncekit store, or, with --demo, three replicas
// of it in this process and a flash sale against them.
//
//	inventory --demo                                   # make run: embedded store and broker
//	inventory --demo --store redis://127.0.0.1:6379 --kafka 127.0.0.1:9092
//	inventory --store etcd://127.0.0.1:2379 --kafka 127.0.0.1:9092 --http :8080 --grpc :9090
//	inventory --help                                   # every flag and the store URLs
package main

import (
	"os"

	"github.com/oncekit/oncekit/examples/inventory/app"
)

func main() { os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr, app.Options{})) }
