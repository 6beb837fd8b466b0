package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// KafkaBrokers returns the Kafka-protocol brokers of KAFKA_BROKERS (the
// cmd/kfake broker `scripts/services.sh up` starts), or skips (fails under
// ONCEKIT_REQUIRE_SERVERS=1).
func KafkaBrokers(tb testing.TB) []string {
	tb.Helper()
	return addrs(tb, "KAFKA_BROKERS", 1)
}

var topicSeq atomic.Int64

// KafkaTopic creates a topic with a name unique to this test run and the
// given partitions on brokers, and returns its name.
func KafkaTopic(tb testing.TB, brokers []string, partitions int) string {
	tb.Helper()
	name := fmt.Sprintf("t%d-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9, topicSeq.Add(1))
	if err := CreateKafkaTopic(brokers, name, partitions); err != nil {
		tb.Fatal(err)
	}
	return name
}

// CreateKafkaTopic creates topic with partitions partitions on the broker
// at brokers[0], or finds it there already.
func CreateKafkaTopic(brokers []string, topic string, partitions int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr, err := net.ResolveTCPAddr("tcp", brokers[0])
	if err != nil {
		return err
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	res, err := (&kafka.Client{Addr: addr, Transport: tr}).CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}}})
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	if err := res.Errors[topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}
