// Package kafkamw runs a Kafka consumer, in a consumer group, on an
// idem.Guard so that each message's effect happens once: nothing lost,
// nothing run twice, across redeliveries, rebalances, retried produces and
// crashed consumers. It works on its own Message type, whichever client
// carries it: KafkaGoReader and KafkaGoWriter adapt
// github.com/segmentio/kafka-go, kafkamw/franz adapts franz-go.
//
//	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: "orders", GroupID: "shipping"})
//	defer r.Close()
//	c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(r), guard, func(ctx context.Context, m kafkamw.Message) error {
//		return ship(ctx, m) // idem.KeyFrom(ctx) and idem.FenceFrom(ctx) are set
//	}, kafkamw.WithConcurrency(4), kafkamw.WithDeadLetter(kafkamw.KafkaGoWriter(dlqWriter), "orders.dlq"))
//	if err != nil { ... }
//	err = c.Run(ctx) // until ctx ends or c.Shutdown
//
// # Per message
//
// FetchMessage → key → claim (Guard.Do) → handler → Complete → commit. The
// key is the message-id header (WithKeyHeader), else an extractor's
// (WithKeyExtractor), else the message's topic, partition and offset
// (WithRequireKey refuses the fallback). It is stored scoped by the consumer
// group and topic (WithScope), hashed. A message whose key is already
// completed — a redelivery, or a producer's retry — is committed without
// calling the handler (Stats.Duplicates). Two messages with one key are
// the same message when their topic, Kafka record key and value are the
// same (the fingerprint; headers are left out): one with the same key but
// another record key or value is a key reused, and is rejected.
//
// # Offsets
//
// A partition's offset is committed only up to the highest offset below
// which every message is done (handled, found done, or dead-lettered), and
// never moves back. Handlers of one partition run in offset order, one at a
// time; WithConcurrency runs several partitions at once. Claims are
// pipelined (WithPipeline): a message is claimed while the ones before it in
// its partition are handled, and completes while the ones after it are, so
// the store's two round trips per message are off the critical path.
// Commits are batched: one CommitMessages covers every partition that moved.
//
// # Failures
//
//   - A handler error is retried with jittered exponential backoff
//     (WithRetry); after the last attempt, or at once for a Permanent error,
//     the message is published to the dead-letter destination
//     (WithDeadLetter) with its coordinates and the error in headers, under
//     its claim, and recorded as done: a redelivery is not dead-lettered
//     again. Only then is it committed. A panic is a handler error. Without a
//     dead-letter destination, such a message stops Run with a *PoisonError.
//   - A message that cannot be claimed — an empty or malformed key, a key
//     reused with another payload (idem.ErrMismatch) — is dead-lettered the
//     same way, never handled unkeyed. The rejection is recorded under the
//     message's topic, partition and offset, so a redelivery of that message
//     is not dead-lettered again.
//   - A handler error is the handler's, whatever it wraps: an error that
//     wraps a final error a Guard the handler calls itself replayed is
//     retried like any other, not taken for a duplicate.
//   - The store unreachable: the message is retried with backoff, without
//     counting attempts; nothing after it is committed, and once WithPipeline
//     messages wait, fetching waits too. When the store answers, it goes on.
//   - A rebalance: messages of a partition taken away that were still in
//     flight are not committed (their lane is dropped when the partition is
//     read again); the new owner reads them again, finds their claim in
//     flight or done, waits for it, and commits. A partition that comes back
//     at a higher offset (another member committed meanwhile) never has an
//     offset below that committed: the group's offset does not move back.
//
// # What "once" covers
//
// The record of a message and its handler's effect are written at
// different moments unless they commit together: pass the effect to
// idem.Commit (a Redis script of redisstore.Effect, an etcd transaction of
// etcdstore.Effect, an SQL transaction of sqlstore.Effect, a ZooKeeper
// multi-operation of zkstore.Effect, a memstore function) and both happen
// or neither. An
// effect elsewhere keyed on idem.KeyFrom(ctx) (a unique column, a
// conditional write) is once at its resource. Any other effect is at least
// once: a consumer killed after the effect and before the record runs it
// again when its claim's lease runs out.
//
// # Shutdown
//
// Shutdown stops fetching, lets the handlers in flight finish with their
// contexts intact, commits what is done and makes Run return nil (bounded by
// Shutdown's ctx, after which handlers are cancelled). Cancelling Run's ctx
// cancels the handlers and still commits what finished. The caller closes
// the Reader after Run returns; until it does, the Reader stays in the group
// and keeps its partitions.
//
// # Producing
//
// Producer wraps a Writer (KafkaGoWriter, franz.NewWriter) and stamps each message with a fresh
// message-id once, so the Writer's retries, Producer's own
// (WithSendRetries) and the caller's resends of the same slice carry the same
// key and are handled once.
package kafkamw
