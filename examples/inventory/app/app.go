package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/examples/inventory"
	"github.com/oncekit/oncekit/examples/inventory/flashsale"
	"github.com/oncekit/oncekit/kafkamw/kafkamwtest"
	"github.com/oncekit/oncekit/observe/promobs"
)

// Options are what a variant of the command changes.
type Options struct {
	// SKULocker, if set, returns the Locker the SKU lock is taken through
	// (default: the store itself), and what closes it.
	SKULocker func(storeURL string) (lock.Locker, func(), error)
}

// Main runs the command with args and returns its exit status.
func Main(args []string, stdout, stderr io.Writer, o Options) int {
	redis.SetLogger(redisLogger{})
	return run(args, stdout, stderr, o)
}

// redisLogger drops go-redis's own reports of failed dials: an unreachable
// store is reported once, by the service (a one-line error at start, 503s
// and oncekit_store_errors_total while it runs).
type redisLogger struct{}

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	if msg := fmt.Sprintf(format, v...); !strings.Contains(msg, "failed to dial") {
		log.Print("redis: ", msg)
	}
}

type flags struct {
	store, kafka, httpAddr, grpcAddr, prefix, topic, group string
	replicas                                               int
	demo, lockFree                                         bool
	buyers                                                 int
	stock                                                  int64
	dupRate, holdRate, payRate                             float64
	holdTTL                                                time.Duration
	html                                                   string
	reportEvery                                            time.Duration
}

// syncWriter serialises the writes of the goroutines that share one
// output: the replicas' report jobs and the flash sale's progress write to
// stderr at once, and Main's caller may pass any io.Writer.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func run(args []string, stdout, stderr io.Writer, o Options) int {
	out, errOut := &syncWriter{w: stdout}, &syncWriter{w: stderr}
	if p, ok := stdout.(*os.File); ok && p == stderr { // (one file for both: one lock)
		errOut = out
	}
	stdout, stderr = out, errOut
	var f flags
	fs := flag.NewFlagSet("inventory", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.store, "store", env("INVENTORY_STORE", "memory://"), "the oncekit store URL (see below; env INVENTORY_STORE)")
	fs.StringVar(&f.kafka, "kafka", env("KAFKA_BROKERS", ""), `Kafka brokers, comma-separated; "embedded" starts one in this process; "" runs without Kafka (env KAFKA_BROKERS; --demo without this flag starts an embedded one)`)
	fs.StringVar(&f.httpAddr, "http", "127.0.0.1:8080", "HTTP address of the first replica")
	fs.StringVar(&f.grpcAddr, "grpc", "127.0.0.1:9090", "gRPC address of the first replica")
	fs.IntVar(&f.replicas, "replicas", 1, "replicas in this process (each on the next ports)")
	fs.StringVar(&f.prefix, "prefix", "inventory:", "prefix of the inventory's keys in the store")
	fs.StringVar(&f.topic, "topic", inventory.TopicOrderCreated, "topic of order.created")
	fs.StringVar(&f.group, "group", "shipping", "consumer group of the shipping consumers")
	fs.BoolVar(&f.lockFree, "lock-free", true, "sell without the SKU lock (package stock takes the units atomically on every store; false queues sales behind the lock, to compare)")
	fs.BoolVar(&f.demo, "demo", false, "run three replicas on free ports and a flash sale against them, print the report, exit")
	fs.IntVar(&f.buyers, "buyers", 1000, "demo: buyers")
	fs.Int64Var(&f.stock, "stock", 100, "demo: units for sale")
	fs.Float64Var(&f.dupRate, "dup-rate", 0.3, "demo: share of buyers who send their order twice")
	fs.Float64Var(&f.holdRate, "hold-rate", 0.2, "demo: share of HTTP buyers who hold a unit first, then pay or let the hold run out")
	fs.Float64Var(&f.payRate, "pay-rate", 0.5, "demo: share of holders who pay")
	fs.DurationVar(&f.holdTTL, "hold-ttl", 2*time.Second, "demo: how long a hold lasts")
	fs.StringVar(&f.html, "html", "", "demo: write the report as HTML to this file")
	fs.DurationVar(&f.reportEvery, "report-every", time.Minute, "log the sale's totals at every multiple of this, once across the replicas (0: never)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: inventory [flags]\n\n")
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\n%s\n", inventory.StoreHelp)
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if f.replicas < 1 {
		fmt.Fprintln(stderr, "inventory: --replicas must be at least 1")
		return 2
	}
	if f.demo {
		if f.replicas == 1 {
			f.replicas = 3
		}
		f.httpAddr, f.grpcAddr = "127.0.0.1:0", "127.0.0.1:0"
		// A run of its own in shared servers: fresh keys, topic and group.
		run := fmt.Sprintf("demo-%d", time.Now().UnixNano())
		f.prefix, f.topic, f.group = "inventory:"+run+":", "order.created."+run, "shipping."+run
		kafkaSet := false // --kafka "" runs the demo without Kafka
		fs.Visit(func(fl *flag.Flag) { kafkaSet = kafkaSet || fl.Name == "kafka" })
		if f.kafka == "" && !kafkaSet {
			f.kafka = "embedded"
		}
	}
	if err := serve(f, o, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "inventory:", oneLine(err))
		return 1
	}
	return 0
}

func serve(f flags, o Options, stdout, stderr io.Writer) error {
	metrics := promobs.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	store, backend, closeStore, err := inventory.Open(f.store, f.prefix, metrics)
	if err != nil {
		return err
	}
	defer closeStore()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, _, err = backend.Counts(ctx)
	cancel()
	if err != nil {
		return fmt.Errorf("store %s is unreachable: %w", redact(f.store), err)
	}

	var k *inventory.Kafka
	if f.kafka != "" {
		brokers := strings.Split(f.kafka, ",")
		if f.kafka == "embedded" {
			b, err := kafkamwtest.Start(kafkamwtest.Config{Port: 0})
			if err != nil {
				return err
			}
			defer b.Close()
			brokers = []string{b.Addr()}
		}
		if err := kafkamwtest.CreateTopic(brokers, f.topic, 4); err != nil {
			return fmt.Errorf("kafka %s: %w", strings.Join(brokers, ","), err)
		}
		k = &inventory.Kafka{Brokers: brokers, Topic: f.topic, Group: f.group}
	}

	cfg := inventory.Config{Store: store, Backend: backend, Gatherer: reg, LockFree: f.lockFree,
		ReportEvery: f.reportEvery, ReportName: "inventory/report/" + f.prefix, ReportTo: stderr}
	if o.SKULocker != nil {
		l, closeLocker, err := o.SKULocker(f.store)
		if err != nil {
			return err
		}
		defer closeLocker()
		cfg.SKULocker = l
	}
	svc, err := inventory.New(cfg)
	if err != nil {
		return err
	}
	metrics.WatchGuard("inventory", svc.Guard()) // oncekit_idem_claims_in_flight{name="inventory"}
	var replicas []*inventory.Replica
	defer func() {
		for _, r := range replicas {
			r.Stop()
		}
	}()
	for i := range f.replicas {
		r, err := inventory.Start(svc, nextPort(f.httpAddr, i), nextPort(f.grpcAddr, i), k)
		if err != nil {
			return err
		}
		replicas = append(replicas, r)
		fmt.Fprintf(stderr, "replica %d: http://%s  grpc %s\n", i+1, r.HTTPAddr, r.GRPCAddr)
	}
	fmt.Fprintf(stderr, "store %s, kafka %s\n", redact(f.store), map[bool]string{true: "none", false: f.kafka}[k == nil])

	if !f.demo {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
		<-sigs
		fmt.Fprintln(stderr, "stopping")
		return nil
	}
	return demo(f, replicas, k != nil, stdout, stderr)
}

func demo(f flags, replicas []*inventory.Replica, kafka bool, stdout, stderr io.Writer) error {
	cfg := flashsale.Config{Buyers: f.buyers, Stock: f.stock, DupRate: f.dupRate, Progress: stderr,
		HoldRate: f.holdRate, PayRate: f.payRate, HoldTTL: f.holdTTL}
	for _, r := range replicas {
		cfg.Targets = append(cfg.Targets, "http://"+r.HTTPAddr)
		cfg.GRPC = append(cfg.GRPC, r.GRPCAddr)
	}
	if kafka {
		cfg.Shipping = 30 * time.Second
	}
	fmt.Fprintf(stderr, "flash sale: %d buyers, %d units, %.0f%% of buyers send their order twice, half of them over gRPC\n",
		cfg.Buyers, cfg.Stock, 100*cfg.DupRate)
	rep, err := flashsale.Run(context.Background(), cfg)
	if err != nil {
		return err
	}
	rep.Print(stdout)
	if f.html != "" {
		out, err := os.Create(f.html)
		if err != nil {
			return err
		}
		if err := rep.WriteHTML(out); err != nil {
			out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
		fmt.Fprintln(stderr, "report:", f.html)
	}
	if !rep.OK() {
		return errors.New("the flash sale broke an invariant")
	}
	return nil
}

// nextPort is addr with its port plus i (port 0 stays 0).
func nextPort(addr string, i int) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || i == 0 {
		return addr
	}
	var p int
	fmt.Sscan(port, &p)
	if p == 0 {
		return addr
	}
	return net.JoinHostPort(host, fmt.Sprint(p+i))
}

// redact hides a password in a store URL.
func redact(u string) string {
	if at := strings.Index(u, "@"); at > 0 {
		if s := strings.Index(u, "://"); s > 0 && s < at {
			return u[:s+3] + "…" + u[at:]
		}
	}
	return u
}

// oneLine is the first line of err's message.
func oneLine(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
