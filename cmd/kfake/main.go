// Command kfake runs a Kafka-protocol broker on 127.0.0.1 for oncekit's tests
// and demos (`make services-up` starts it): franz-go's kfake, one process, no
// replication, topics created on first use.
//
//	kfake --port 9092 --topic orders:4 --pid-file /tmp/kfake.pid
//
// It prints its address once it listens and stops on SIGINT or SIGTERM.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/oncekit/oncekit/kafkamw/kafkamwtest"
)

type topicsFlag map[string]int32

func (f topicsFlag) String() string { return "" }

func (f topicsFlag) Set(s string) error {
	name, n, ok := strings.Cut(s, ":")
	parts := int64(1)
	if ok {
		var err error
		if parts, err = strconv.ParseInt(n, 10, 32); err != nil || parts < 1 {
			return fmt.Errorf("want NAME or NAME:PARTITIONS, got %q", s)
		}
	}
	if name == "" {
		return fmt.Errorf("want NAME or NAME:PARTITIONS, got %q", s)
	}
	f[name] = int32(parts)
	return nil
}

func main() {
	cfg := kafkamwtest.Config{Topics: topicsFlag{}}
	var pidFile string
	flag.IntVar(&cfg.Port, "port", 9092, "port on 127.0.0.1 (0: a free one)")
	flag.Var(topicsFlag(cfg.Topics), "topic", "topic to create at start, NAME or NAME:PARTITIONS (repeatable)")
	flag.IntVar(&cfg.DefaultPartitions, "partitions", 4, "partitions of a topic created on first use")
	flag.StringVar(&cfg.DataDir, "data-dir", "", "keep topics and offsets in this directory across restarts")
	flag.DurationVar(&cfg.MinSessionTimeout, "min-session-timeout", 100*time.Millisecond, "shortest consumer-group session accepted")
	flag.StringVar(&pidFile, "pid-file", "", "write the process id to this file")
	flag.Parse()

	b, err := kafkamwtest.Start(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kfake:", err)
		os.Exit(1)
	}
	if pidFile != "" {
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			b.Close()
			fmt.Fprintln(os.Stderr, "kfake:", err)
			os.Exit(1)
		}
	}
	fmt.Println(b.Addr())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	<-sigs
	b.Close()
}
