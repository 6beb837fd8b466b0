package redlockstore

import (
	"slices"
	"testing"
	"time"

	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// A fenced release keeps the hold's fence on every node: each node whose
// take is known is sent a lower bound on its clock (so that it reads no
// clock); a node whose answer is on its way is waited for; a node that
// answered every request without being taken is sent nothing; any other
// is sent no bound (it reads its clock if the token holds it). No node is
// let off the fence.
func TestReleasePlan(t *testing.T) {
	const floor = 1_000_000         // µs
	at := time.Now().Add(time.Hour) // no time passed since the readings
	mk := func(clocks ...int64) *votes {
		v := &votes{nodes: map[int]bool{}, per: make([]perNode, len(clocks))}
		for i, c := range clocks {
			if c > 0 {
				v.nodes[i] = true
				v.per[i].take = take{clock: rediskit.ClockReading{US: c, At: at}, plain: true}
			}
		}
		return v
	}
	check := func(t *testing.T, plan []releaseArg, wantClock []int64, wantPlain []bool) {
		t.Helper()
		for i, a := range plan {
			if a.floor != floor || a.clock != wantClock[i] || a.plain != wantPlain[i] {
				t.Errorf("node %d: %+v, want floor %d, clock %d, plain %v", i, a, floor, wantClock[i], wantPlain[i])
			}
		}
	}
	t.Run("known and unknown takes", func(t *testing.T) {
		clocks := []int64{floor, floor - 100, floor + 50, 0, 0, 0}
		v := mk(clocks...)
		v.per[3].flying = 1    // its answer is on its way
		v.per[4].unsure = true // its request failed: it may have taken the node
		plan := v.releasePlan(floor, 6)
		check(t, plan, clocks, []bool{true, true, true, true, true, true})
		var kinds []string
		for _, a := range plan {
			kinds = append(kinds, map[bool]string{true: "await"}[a.await]+map[bool]string{true: "skip"}[a.skip])
		}
		if want := []string{"", "", "", "await", "", "skip"}; !slices.Equal(kinds, want) {
			t.Errorf("kinds %q, want %q", kinds, want)
		}
		if v.per[3].awaiting != 1 {
			t.Errorf("node 3 awaited by %d releases, want 1", v.per[3].awaiting)
		}
	})
	t.Run("a take by the full script", func(t *testing.T) {
		v := mk(floor-1, floor, floor-2, 0, 0)
		v.per[1].take.plain = false
		check(t, v.releasePlan(floor, 5), []int64{floor - 1, floor, floor - 2, 0, 0}, []bool{true, false, true, false, false})
	})
	t.Run("nodes given back", func(t *testing.T) {
		v := mk(floor, floor+1, floor-1, floor-2, floor-3)
		delete(v.nodes, 1) // no longer the token's: nothing known of it
		check(t, v.releasePlan(floor, 5), []int64{floor, 0, floor - 1, floor - 2, floor - 3}, []bool{true, true, true, true, true})
	})
	t.Run("no votes", func(t *testing.T) {
		var v *votes
		check(t, v.releasePlan(floor, 5), make([]int64, 5), make([]bool, 5))
	})
	t.Run("time passed since a reading", func(t *testing.T) {
		v := mk(floor-10_000, 0, 0)
		v.per[0].take.clock.At = time.Now().Add(-time.Second)
		got := v.releasePlan(floor, 3)[0].clock
		if lo := int64(floor - 10_000 + 980_000); got < lo || got > floor-10_000+1_000_000 {
			t.Errorf("clock bound %d, want the reading plus 99 %% of the second since (≥ %d)", got, lo)
		}
	})
}
