package franz_test

import (
	"context"
	"log"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/kafkamw/franz"
	"github.com/oncekit/oncekit/storage/memstore"
)

// A kafkamw Consumer reading through franz-go, dead-lettering through it
// too. (Not run: it needs a broker.)
func Example() {
	r, err := franz.NewReader(kgo.SeedBrokers("127.0.0.1:9092"),
		kgo.ConsumerGroup("shipping"), kgo.ConsumeTopics("order.created"))
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	guard, err := idem.NewGuard(memstore.New()) // a shared store in production: redisstore, etcdstore...
	if err != nil {
		log.Fatal(err)
	}
	c, err := kafkamw.NewConsumer(r, guard, func(ctx context.Context, m kafkamw.Message) error {
		log.Printf("ship %s", m.Value) // once per message-id
		return nil
	}, kafkamw.WithDeadLetter(franz.NewWriter(r.Client(), "order.created.dlq"), ""))
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
