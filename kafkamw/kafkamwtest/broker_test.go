package kafkamwtest_test

import (
	"testing"

	"github.com/oncekit/oncekit/kafkamw/kafkamwtest"
)

func TestCreateTopicTwice(t *testing.T) {
	b, err := kafkamwtest.Start(kafkamwtest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 2 {
		if err := kafkamwtest.CreateTopic([]string{b.Addr()}, "orders", 3); err != nil {
			t.Fatal(err)
		}
	}
	if err := kafkamwtest.CreateTopic([]string{"127.0.0.1:1"}, "orders", 3); err == nil {
		t.Fatal("no error from an unreachable broker")
	}
}
