package keep

import (
	"testing"
	"time"
)

func TestHolds(t *testing.T) {
	var k Holds[string]
	expired := make(chan string, 4)
	expire := func(h string) { expired <- h }
	deadline := time.Now().Add(time.Hour)

	if !k.Put("a", "hold-a", deadline, time.Hour, expire) {
		t.Fatal("Put refused a first hold")
	}
	if k.Put("a", "other", deadline, time.Hour, expire) {
		t.Fatal("Put kept a second hold for the same key")
	}
	h, d, ok := k.Take("a")
	if !ok || h != "hold-a" || !d.Equal(deadline) {
		t.Fatalf("Take = %q %v %v", h, d, ok)
	}
	if _, _, ok := k.Take("a"); ok {
		t.Fatal("a hold was taken twice")
	}

	k.Put("b", "hold-b", deadline, time.Millisecond, expire)
	select {
	case h := <-expired:
		if h != "hold-b" {
			t.Fatalf("expired %q", h)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the linger never ran out")
	}
	if _, _, ok := k.Take("b"); ok {
		t.Fatal("an expired hold was taken")
	}

	k.Put("c", "hold-c", deadline, time.Hour, expire)
	if got := k.Close(); len(got) != 1 || got[0] != "hold-c" {
		t.Fatalf("Close returned %v", got)
	}
	if k.Put("d", "hold-d", deadline, time.Hour, expire) {
		t.Fatal("Put kept a hold after Close")
	}
	select {
	case h := <-expired:
		t.Fatalf("%q expired after being taken or closed", h)
	case <-time.After(20 * time.Millisecond):
	}
}
