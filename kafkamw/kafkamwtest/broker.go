package kafkamwtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Config says how to run a broker. The zero value is a broker on a free
// port that creates topics on first use with DefaultPartitions partitions.
type Config struct {
	// Port to listen on, on 127.0.0.1 (0: a free one).
	Port int
	// Topics to create at start, with their partition counts.
	Topics map[string]int32
	// DefaultPartitions of a topic created on first use (default 4).
	DefaultPartitions int
	// DataDir keeps topics and offsets across restarts ("" keeps them in
	// memory only).
	DataDir string
	// MinSessionTimeout is the shortest consumer-group session the broker
	// accepts (default 100 ms, so that tests and demos rebalance fast;
	// kfake's own default is 6 s).
	MinSessionTimeout time.Duration
}

// Broker is a running broker.
type Broker struct {
	c *kfake.Cluster
}

// Start starts a broker.
func Start(cfg Config) (*Broker, error) {
	if cfg.DefaultPartitions <= 0 {
		cfg.DefaultPartitions = 4
	}
	if cfg.MinSessionTimeout <= 0 {
		cfg.MinSessionTimeout = 100 * time.Millisecond
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(cfg.Port),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(cfg.DefaultPartitions),
		kfake.GroupMinSessionTimeout(cfg.MinSessionTimeout),
	}
	for topic, n := range cfg.Topics {
		opts = append(opts, kfake.SeedTopics(n, topic))
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafkamwtest: start: %w", err)
	}
	return &Broker{c: c}, nil
}

// Addr is the broker's host:port.
func (b *Broker) Addr() string { return b.c.ListenAddrs()[0] }

// Close stops the broker (and writes its data when it has a DataDir).
func (b *Broker) Close() { b.c.Close() }

// CreateTopic creates topic with partitions partitions on the broker at
// brokers[0], or finds it there already: for a broker that does not create
// topics on first use (Kafka's own default), and so that a writer's first
// message does not race the topic's creation.
func CreateTopic(brokers []string, topic string, partitions int) error {
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
