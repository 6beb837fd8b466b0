package kbroker_test

import (
	"testing"

	"github.com/oncekit/oncekit/internal/kbroker"
)

func TestCreateTopicTwice(t *testing.T) {
	b, err := kbroker.Start(kbroker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 2 {
		if err := kbroker.CreateTopic([]string{b.Addr()}, "orders", 3); err != nil {
			t.Fatal(err)
		}
	}
	if err := kbroker.CreateTopic([]string{"127.0.0.1:1"}, "orders", 3); err == nil {
		t.Fatal("no error from an unreachable broker")
	}
}
