package kafkamw

import (
	"context"
	"strconv"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/memstore"
)

// BenchmarkMessageCost: one message through the Consumer's own work —
// its key, its claim, the handler, the completion — over memstore, with
// no broker: what the middleware costs per message, in time and
// allocations, for a new key and for a duplicate (a redelivery). The
// reader is never started (the broker's part is BenchmarkConsumer's).
//
//	go test -run '^$' -bench MessageCost -benchmem ./kafkamw
func BenchmarkMessageCost(b *testing.B) {
	g, err := idem.NewGuard(memstore.New())
	if err != nil {
		b.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, GroupID: "bench", Topic: "orders"})
	defer r.Close()
	c, err := NewConsumer(KafkaGoReader(r), g, func(context.Context, Message) error { return nil })
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	done := make(chan struct{})
	close(done) // (every earlier message of the partition has had its turn)
	for _, mode := range []string{"new-key", "duplicate"} {
		b.Run(mode, func(b *testing.B) {
			b.ReportAllocs()
			msg := Message{Topic: "orders", Partition: 0, Value: []byte(`{"order":"o-1","sku":"phone-x"}`),
				Headers: []Header{{Key: "Content-Type", Value: []byte("application/json")}}}
			for i := 0; b.Loop(); i++ {
				msg.Offset = int64(i)
				id := "m-" + mode
				if mode == "new-key" {
					id += strconv.Itoa(i)
				}
				msg.Headers = append(msg.Headers[:1], Header{Key: DefaultKeyHeader, Value: []byte(id)})
				key, err := c.keyOf(msg)
				if out := c.process(ctx, msg, key, err, done, nil, func() {}); out != observe.Executed && out != observe.Duplicate {
					b.Fatalf("outcome %v", out)
				}
			}
		})
	}
}
