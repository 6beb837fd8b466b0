package keep

import (
	"fmt"
	"testing"
	"time"
)

func TestRecent(t *testing.T) {
	var r Recent
	if r.Hot("k") {
		t.Fatal("a key never let go is hot")
	}
	r.LetGo("k")
	if !r.Hot("k") {
		t.Fatal("a key just let go is not hot")
	}
	r.Wasted("k")
	if r.Hot("k") {
		t.Fatal("a key whose kept hold went unused is hot while it cools")
	}
	r.mu.Lock()
	e := r.at["k"]
	e.letGo, e.coolUntil = time.Now().Add(-HotFor), time.Now().Add(-time.Millisecond)
	r.at["k"] = e
	r.mu.Unlock()
	if r.Hot("k") {
		t.Fatal("a key let go HotFor ago is hot")
	}
	r.LetGo("k")
	if !r.Hot("k") {
		t.Fatal("a cooled key let go again is not hot")
	}
}

func TestRecentSweeps(t *testing.T) {
	var r Recent
	for i := range 5000 {
		r.LetGo(fmt.Sprint(i))
	}
	r.mu.Lock()
	for k, e := range r.at { // all old now
		e.letGo = time.Now().Add(-2 * HotFor)
		r.at[k] = e
	}
	r.mu.Unlock()
	for i := range 2 * 5000 {
		r.LetGo(fmt.Sprint("new", i))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.at["1"]; ok || len(r.at) > 2*5000 {
		t.Errorf("%d entries after a sweep, old ones kept: %v", len(r.at), ok)
	}
}

func TestHandOffsLeft(t *testing.T) {
	h := HandOffs{Max: 2, Hold: 50 * time.Millisecond}
	now := time.Now()
	old := now.Add(-time.Second)
	for _, c := range []struct {
		n    int
		took time.Time
		want bool
	}{{0, old, true}, {1, old, true}, {2, old, false}, {2, now, true}, {100, now, true}} {
		if got := h.Left(c.n, c.took); got != c.want {
			t.Errorf("Left(%d, %v ago) = %v, want %v", c.n, time.Since(c.took).Round(time.Millisecond), got, c.want)
		}
	}
	if (HandOffs{Max: 0, Hold: time.Hour}).Left(0, now) {
		t.Error("Max 0 allows a hand-off")
	}
}
