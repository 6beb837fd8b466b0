// Package kafkatest holds what the tests of kafkamw and of its client
// adapters share: topics, writers, readers with short timeouts, effect
// counters, offset checks, and the scenarios every Reader runs.
package kafkatest
