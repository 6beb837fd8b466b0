// Package kafkamwtest gives tests of a Kafka consumer or producer a
// Kafka-protocol broker, as oncekit's own tests get theirs: the broker
// named by KAFKA_BROKERS when it is set, else one started in the test
// process (franz-go's kfake: one process, no replication, but produce,
// fetch, consumer groups, offset commits and topic admin as kafka-go
// needs them).
//
//	func TestShipping(t *testing.T) {
//		brokers := kafkamwtest.Brokers(t)           // stopped at t's cleanup
//		topic := kafkamwtest.Topic(t, brokers, 4)   // a fresh topic, 4 partitions
//		...
//	}
//
// Start runs a broker outside a test (a demo, a local development loop).
package kafkamwtest
