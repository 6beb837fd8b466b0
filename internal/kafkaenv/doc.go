// Package kafkaenv gives tests a Kafka-protocol broker: the one named by
// KAFKA_BROKERS (as `make test` and `make services-up` export it), or one
// started in the test process (internal/kbroker) when the variable is unset.
package kafkaenv
