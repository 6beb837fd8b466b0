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
	e := r.table.slot("k")
	e.letGo, e.coolUntil = time.Since(epoch)-HotFor, time.Since(epoch)-time.Millisecond
	r.mu.Unlock()
	if r.Hot("k") {
		t.Fatal("a key let go HotFor ago is hot")
	}
	r.LetGo("k")
	if !r.Hot("k") {
		t.Fatal("a cooled key let go again is not hot")
	}
}

// A key that shares its slot with one let go since is forgotten, never
// mistaken for the other; the table does not grow.
func TestRecentForgets(t *testing.T) {
	var r Recent
	r.LetGo("k")
	r.mu.Lock()
	slot := r.table.slot("k")
	r.mu.Unlock()
	other := ""
	for i := 0; other == ""; i++ {
		k := fmt.Sprint("other", i)
		r.mu.Lock()
		if r.table.slot(k) == slot {
			other = k
		}
		r.mu.Unlock()
	}
	if r.Hot(other) {
		t.Fatalf("%q is hot by the entry of the key sharing its slot", other)
	}
	r.LetGo(other)
	if r.Hot("k") || !r.Hot(other) {
		t.Fatalf("after %q took the slot: k hot %v, %q hot %v", other, r.Hot("k"), other, r.Hot(other))
	}
	for i := range 5 * RecentSlots {
		r.LetGo(fmt.Sprint("new", i))
	}
	if len(r.table.slots) != RecentSlots {
		t.Errorf("%d slots, want %d", len(r.table.slots), RecentSlots)
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

func TestMarks(t *testing.T) {
	m := Marks{For: 50 * time.Millisecond}
	if m.Marked("k") {
		t.Fatal("a key never marked is marked")
	}
	m.Mark("k")
	if !m.Marked("k") || m.Marked("other") {
		t.Fatalf("after marking k: k %v, other %v", m.Marked("k"), m.Marked("other"))
	}
	time.Sleep(m.For)
	if m.Marked("k") {
		t.Fatal("a mark older than For still counts")
	}
}
