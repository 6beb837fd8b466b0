package zkstore

import (
	"testing"

	"github.com/go-zookeeper/zk"
)

// Record expiry never compares two leaders' clocks: a record stamped by
// the leader of epoch 3 whose end has passed by the clock of the leader of
// epoch 4 (whose clock may run ahead of the old one's by more than a
// lease) is written again, not taken over; by the same leader's clock it
// has ended. (Clock skew between ensemble members cannot be made on one
// machine: this drives the decision with the inputs an election with skew
// gives it.)
func TestJudgeNeverComparesTwoLeadersClocks(t *testing.T) {
	const lease = 1000
	stamped := &zk.Stat{Mtime: 50_000, Mzxid: 3<<32 | 17} // epoch 3
	exp := stamped.Mtime + lease
	for _, c := range []struct {
		name string
		now  serverClock
		want verdict
	}{
		{"same leader, before the end", serverClock{ms: exp - 1, epoch: 3}, live},
		{"same leader, after the end", serverClock{ms: exp, epoch: 3}, ended},
		{"new leader whose clock runs 10 s ahead", serverClock{ms: stamped.Mtime + 10_000, epoch: 4}, restamp},
		{"new leader whose clock is behind", serverClock{ms: exp - 1, epoch: 4}, live},
	} {
		if got := judge(exp, stamped, c.now); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
