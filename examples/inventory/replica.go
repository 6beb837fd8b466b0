package inventory

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/oncekit/oncekit/kafkamw"
)

// Kafka says where a replica announces sales and ships them.
type Kafka struct {
	Brokers []string
	// Topic of order.created (default TopicOrderCreated).
	Topic string
	// Group of the shipping consumers (default "shipping").
	Group string
}

// Replica is a running replica: HTTP and gRPC listeners, and with Kafka the
// outbox relay and a shipping consumer.
type Replica struct {
	HTTPAddr, GRPCAddr string

	cancel context.CancelFunc
	wg     sync.WaitGroup
	stop   []func() // in reverse order, before the background work ends
	after  []func() // once it has
}

// Start serves s on httpAddr and grpcAddr ("127.0.0.1:0": free ports) and,
// when k is not nil, relays its outbox to Kafka and runs a shipping
// consumer, until Stop.
func Start(s *Service, httpAddr, grpcAddr string, k *Kafka) (*Replica, error) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Replica{cancel: cancel}
	fail := func(err error) (*Replica, error) { r.Stop(); return nil, err }

	h, err := s.Handler()
	if err != nil {
		return fail(err)
	}
	hl, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return fail(err)
	}
	r.HTTPAddr = hl.Addr().String()
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	r.goServe(func() { _ = hs.Serve(hl) }, func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		_ = hs.Shutdown(sctx)
	})

	gs, err := s.GRPCServer()
	if err != nil {
		return fail(err)
	}
	gl, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		return fail(err)
	}
	r.GRPCAddr = gl.Addr().String()
	r.goServe(func() { _ = gs.Serve(gl) }, gs.GracefulStop)

	if k != nil {
		if err := r.startKafka(ctx, s, *k); err != nil {
			return fail(err)
		}
	}
	r.wg.Add(1)
	go func() { defer r.wg.Done(); _ = s.Report(ctx) }()
	return r, nil
}

func (r *Replica) goServe(serve func(), stop func()) {
	r.wg.Add(1)
	go func() { defer r.wg.Done(); serve() }()
	r.stop = append(r.stop, stop)
}

func (r *Replica) startKafka(ctx context.Context, s *Service, k Kafka) error {
	if len(k.Brokers) == 0 {
		return errors.New("inventory: Kafka without brokers")
	}
	if k.Topic == "" {
		k.Topic = TopicOrderCreated
	}
	if k.Group == "" {
		k.Group = "shipping"
	}
	tr := &kafka.Transport{}
	w := &kafka.Writer{Addr: kafka.TCP(k.Brokers...), Topic: k.Topic, Balancer: &kafka.Hash{},
		BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll, Transport: tr}
	p, err := kafkamw.NewProducer(kafkamw.KafkaGoWriter(w), kafkamw.WithSendRetries(3, 50*time.Millisecond, time.Second))
	if err != nil {
		return err
	}
	var closing atomic.Bool // set when the replica stops
	debug := os.Getenv("INVENTORY_KAFKA_DEBUG") != ""
	// MaxWait bounds a fetch that finds nothing new; one that finds a
	// message returns at once (MinBytes 1). kafka-go asks the broker to
	// wait 3/4 of it and reads until MaxWait: at 50 ms, a broker answering
	// a loaded replica 13 ms late made the reader report an i/o timeout and
	// reconnect. A reader's Close waits for its fetch, so a stopping
	// replica pays up to MaxWait.
	rc := kafka.ReaderConfig{
		Brokers: k.Brokers, Topic: k.Topic, GroupID: k.Group, StartOffset: kafka.FirstOffset,
		MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 250 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond,
		SessionTimeout: 2 * time.Second, RebalanceTimeout: 2 * time.Second, JoinGroupBackoff: 200 * time.Millisecond,
		ErrorLogger: kafka.LoggerFunc(func(format string, args ...any) {
			switch {
			case closing.Load():
				return // a reader being closed reports the dials it cancelled: nothing is wrong
			case !debug && rebalancing(args):
				return // replicas joining the group at once: kafka-go joins again
			}
			log.Printf("kafka reader: "+format, args...)
		}),
	}
	if debug {
		rc.Logger = kafka.LoggerFunc(func(format string, args ...any) { log.Printf("kafka: "+format, args...) })
	}
	rd := kafka.NewReader(rc)
	c, err := s.ShippingConsumer(kafkamw.KafkaGoReader(rd), kafkamw.WithConcurrency(4))
	if err != nil {
		_ = rd.Close()
		return err
	}
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		_ = s.RelayOutbox(ctx, p, "inventory/outbox-relay/"+k.Topic+"/"+k.Group, 100*time.Millisecond)
	}()
	go func() { defer r.wg.Done(); _ = c.Run(ctx) }()
	r.stop = append(r.stop, func() {
		closing.Store(true)
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		_ = c.Shutdown(sctx)
	})
	r.after = append(r.after, func() {
		_ = rd.Close()
		_ = w.Close()
		tr.CloseIdleConnections()
	})
	return nil
}

// Stop stops the replica: its servers finish their requests, the
// consumer its messages.
func (r *Replica) Stop() {
	for i := len(r.stop) - 1; i >= 0; i-- {
		r.stop[i]()
	}
	r.cancel()
	r.wg.Wait()
	for _, f := range r.after { // the clients, now that nothing uses them
		f()
	}
	r.stop, r.after = nil, nil
}

// rebalancing reports whether a kafka-go log line's arguments carry the
// group coordinator's "rebalance in progress", which the reader handles
// by joining again.
func rebalancing(args []any) bool {
	for _, a := range args {
		if err, ok := a.(error); ok && errors.Is(err, kafka.RebalanceInProgress) {
			return true
		}
	}
	return false
}
