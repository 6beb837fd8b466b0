// Package kbroker runs a Kafka-protocol broker (franz-go's kfake) on
// loopback, for tests, the embedded demo and cmd/kfake, and creates topics. It is not a Kafka:
// one process, no replication; what kafka-go needs from a broker (produce,
// fetch, consumer groups, offset commits, topic admin) it speaks.
package kbroker
