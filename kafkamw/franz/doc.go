// Package franz runs kafkamw on franz-go (github.com/twmb/franz-go/pkg/kgo)
// instead of kafka-go: NewReader is a kafkamw.Reader over a kgo client in
// a consumer group, NewWriter a kafkamw.Writer (for a Producer, a
// dead-letter or a retry topic). The Consumer, its handler and its
// guarantees are the same; records arrive as kafkamw.Message.
//
//	r, err := franz.NewReader(kgo.SeedBrokers("127.0.0.1:9092"),
//		kgo.ConsumerGroup("shipping"), kgo.ConsumeTopics("order.created"))
//	defer r.Close()
//	c, err := kafkamw.NewConsumer(r, guard, ship)
//	err = c.Run(ctx)
//
// The Reader turns auto-commit off (the Consumer commits each offset once
// the message and every one before it are done) and tracks the group's
// assignments: a commit is sent only for a partition still assigned and a
// message fetched since its assignment, so a member that lost a partition
// at a rebalance never moves the group's offset back.
package franz
