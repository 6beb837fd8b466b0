package redlockstore

import (
	"slices"
	"testing"
	"time"

	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// A fenced release keeps the hold's fence on a majority of the nodes: the
// nodes whose clock has passed it, and as many others the token holds
// (with a clock at most half the TTL behind) as that majority needs. The
// rest are released with no fence kept and no clock read. When no such
// majority is known, every node keeps the fence.
func TestReleasePlan(t *testing.T) {
	const floor = 1_000_000 // µs
	const ttl = 100 * time.Millisecond
	at := time.Now().Add(time.Hour) // no time passed since the readings
	mk := func(clocks ...int64) *votes {
		v := &votes{nodes: map[int]bool{}, takes: make([]take, len(clocks)), ttl: ttl}
		for i, c := range clocks {
			if c > 0 {
				v.nodes[i] = true
				v.takes[i] = take{clock: rediskit.ClockReading{US: c, At: at}, plain: true}
			}
		}
		return v
	}
	const keep, passed = "keep", "passed"
	kinds := func(plan []releaseArg) []string {
		var k []string
		for _, a := range plan {
			switch {
			case a.floor == floor && a.clock != rediskit.ClockPassed:
				k = append(k, keep)
			case a.floor == 0 && a.clock == rediskit.ClockPassed:
				k = append(k, passed)
			default:
				k = append(k, "?")
			}
		}
		return k
	}
	for _, tc := range []struct {
		name   string
		clocks []int64 // 0: take not known
		want   []string
	}{
		{"one node past the fence, two more keep it", []int64{floor, floor - 100, floor - 50, floor - 10, 0},
			[]string{keep, keep, keep, passed, passed}},
		{"a majority past the fence", []int64{floor, floor + 5, floor - 50, floor + 9, floor - 1},
			[]string{keep, keep, passed, keep, passed}},
		{"nodes far behind do not count", []int64{floor, floor - 60_000, floor - 1, floor - 2, 0},
			[]string{keep, passed, keep, keep, passed}},
		{"too few takes known", []int64{floor - 1, 0, 0, floor, 0},
			[]string{keep, keep, keep, keep, keep}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := kinds(mk(tc.clocks...).releasePlan(floor, 3, len(tc.clocks)))
			if !slices.Equal(got, tc.want) {
				t.Errorf("%v, want %v", got, tc.want)
			}
		})
	}
	t.Run("unfenced", func(t *testing.T) {
		for _, a := range mk(5, 6, 7, 0, 0).releasePlan(0, 3, 5) {
			if a.floor != 0 || a.clock == rediskit.ClockPassed {
				t.Errorf("%+v, want no floor and the node's own clock bound", a)
			}
		}
	})
	t.Run("no votes", func(t *testing.T) {
		var v *votes
		if got := kinds(v.releasePlan(floor, 3, 5)); !slices.Equal(got, []string{keep, keep, keep, keep, keep}) {
			t.Errorf("%v, want the fence kept on every node", got)
		}
	})
	t.Run("nodes given back", func(t *testing.T) {
		v := mk(floor, floor+1, floor-1, floor-2, floor-3)
		delete(v.nodes, 1) // no longer the token's: not past the fence as far as the release knows
		want := []string{keep, passed, keep, keep, passed}
		if got := kinds(v.releasePlan(floor, 3, 5)); !slices.Equal(got, want) {
			t.Errorf("%v, want %v", got, want)
		}
	})
}
