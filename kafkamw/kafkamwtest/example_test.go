package kafkamwtest_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/kafkamw/kafkamwtest"
	"github.com/oncekit/oncekit/storage/memstore"
)

// A test broker in the process, and on it a producer that sends one
// order twice (a retry that the broker had in fact
// received); the shipping consumer ships it once.
func Example_shipping() {
	broker, err := kafkamwtest.Start(kafkamwtest.Config{Topics: map[string]int32{"orders": 1, "orders.dlq": 1}})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()

	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(broker.Addr()), Topic: "orders", Transport: tr, BatchTimeout: time.Millisecond}
	defer w.Close()
	p, err := kafkamw.NewProducer(kafkamw.KafkaGoWriter(w))
	if err != nil {
		log.Fatal(err)
	}
	order := []kafkamw.Message{{Key: []byte("sku-1"), Value: []byte(`{"order":"o-1"}`)}}
	ctx := context.Background()
	_ = p.Send(ctx, order...) // stamps message-id in place...
	_ = p.Send(ctx, order...) // ...so a resend of the same slice has the same key

	guard, err := idem.NewGuard(memstore.New())
	if err != nil {
		log.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: []string{broker.Addr()}, Topic: "orders", GroupID: "shipping",
		MaxWait: 50 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: time.Second,
	})
	defer r.Close()
	dlq := &kafka.Writer{Addr: kafka.TCP(broker.Addr()), Topic: "orders.dlq", Transport: tr}
	defer dlq.Close()
	shipped := make(chan string, 2)
	c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(r), guard, func(ctx context.Context, m kafkamw.Message) error {
		shipped <- string(m.Value)
		return nil
	}, kafkamw.WithDeadLetter(kafkamw.KafkaGoWriter(dlq), ""))
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	fmt.Println("shipped", <-shipped)
	for c.Stats().Duplicates == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	_ = c.Shutdown(ctx)
	fmt.Printf("handled %d, duplicates %d\n", c.Stats().Handled, c.Stats().Duplicates)
	// Output:
	// shipped {"order":"o-1"}
	// handled 1, duplicates 1
}
