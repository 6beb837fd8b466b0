package kafkamwtest

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Brokers returns the addresses of a broker for tb: KAFKA_BROKERS, or an
// in-process broker stopped at tb's cleanup.
func Brokers(tb testing.TB) []string {
	tb.Helper()
	var out []string
	for a := range strings.SplitSeq(os.Getenv("KAFKA_BROKERS"), ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	if len(out) > 0 {
		return out
	}
	b, err := Start(Config{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(b.Close)
	return []string{b.Addr()}
}

var topicSeq atomic.Int64

// Topic creates a topic with a name unique to this test run and the given
// partitions, and returns its name.
func Topic(tb testing.TB, brokers []string, partitions int) string {
	tb.Helper()
	name := fmt.Sprintf("t%d-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9, topicSeq.Add(1))
	if err := CreateTopic(brokers, name, partitions); err != nil {
		tb.Fatal(err)
	}
	return name
}
