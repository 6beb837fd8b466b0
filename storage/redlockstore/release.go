package redlockstore

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// This file releases a hold on the nodes: what each node is sent, and when.
//
// Every node keeps the hold's fence T as the key's last fence until its
// own clock has passed it (rediskit.Base.Release), so that a later
// holder's fence, a maximum over a majority that meets the nodes this hold
// took, comes out above it — also when up to N − quorum of them lose their
// data. A node whose take is known is sent a lower bound on its clock now
// (the reading it gave then, plus the time passed since:
// ClockReading.Floor): at or past T its key is deleted, short of it the key
// becomes a tombstone of T that expires when the node's clock passes it;
// neither reads the clock. A node whose answer to an acquisition round is
// still on its way when the release begins (with a zero-length hold, the
// nodes that answered after the majority) is released once that answer
// has come: sent at once, the release could reach the node before the
// acquisition, find nothing, and leave a second release to the late
// answer; or find the key and read the clock, which the answer would
// have spared. A node that answered every round without being taken is
// not sent anything.

// take is how a node took the votes' token: its clock when it issued its
// fence, and whether by a first attempt (rediskit.AcquireReply's Clock
// and Plain).
type take struct {
	clock rediskit.ClockReading
	plain bool
}

// perNode is what the votes know of one node for the hold's release.
type perNode struct {
	take     take // the node's last take of the token
	flying   int  // acquisition requests sent and not yet answered
	unsure   bool // an answer failed: the request may have taken the node
	awaiting int  // releases waiting for the node's answers (await)
	caught   bool // a take answered while a release waited: it releases the node
}

// node is node i's record, made with the first. v.mu is held.
func (v *votes) node(i int) *perNode {
	if v.per == nil {
		v.per = make([]perNode, len(v.s.nodes))
	}
	return &v.per[i]
}

// sending records a round of acquisition requests to the nodes in idx.
func (v *votes) sending(idx []int) {
	v.mu.Lock()
	for _, i := range idx {
		v.node(i).flying++
	}
	v.mu.Unlock()
}

// answered records the answer of node i to one of them (after took, for a
// take); failed: the request failed, and may have taken the node.
func (v *votes) answered(i int, failed bool) {
	v.mu.Lock()
	p := v.node(i)
	p.flying--
	p.unsure = p.unsure || failed
	if v.landed != nil {
		close(v.landed)
		v.landed = nil
	}
	v.mu.Unlock()
}

// releaseArg is what a hold's release sends one node, beyond the key and
// token: the fence floor to keep (rediskit.Base.Release's floor: the
// hold's fence, or 0), a lower bound on the node's clock now (0: none),
// and whether the short release script fits; or, with await, that the
// node's answers are still on their way.
type releaseArg struct {
	floor uint64
	clock int64
	plain bool
	mine  bool // the token holds the node, as far as the votes know
	await bool
	skip  bool // every request answered, none took the node: nothing to release
}

// releasePlan is what the release of the votes' hold, whose fence is
// floor (0 unfenced), sends each of nodes (by node index; see the top of
// the file). The nodes it marks await are waited for (await), which the
// call must do. Without votes (an owner's re-entry), every node is sent
// the floor and reads its clock.
//
// It is made before end, which forgets the token's nodes.
func (v *votes) releasePlan(floor uint64, nodes int) []releaseArg {
	plan := make([]releaseArg, nodes)
	for i := range plan {
		plan[i].floor = floor
	}
	if v == nil {
		return plan
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	known, allPlain := false, true
	for i := range plan {
		if !v.nodes[i] || v.per == nil {
			continue // not (or no longer) the token's
		}
		t := v.per[i].take
		plan[i].clock, plan[i].plain, plan[i].mine = t.clock.Floor(), t.plain, true
		known, allPlain = true, allPlain && t.plain
	}
	for i := range plan {
		a := &plan[i]
		if !a.mine {
			// Taken, if at all, by the same attempts as the known nodes.
			a.plain = known && allPlain
		}
		if v.per == nil {
			continue
		}
		switch p := &v.per[i]; {
		case p.flying > 0:
			a.await = true
			p.awaiting++
		case !a.mine && !p.unsure:
			a.skip = true
		}
	}
	return plan
}

// await waits until node i has answered every acquisition request the
// votes sent it, or bound passes, or the Store closes, and returns a,
// completed with what the answers said: whether the node is to be
// released (send) and with what. Only for a node releasePlan marked await.
func (v *votes) await(i int, a releaseArg, bound time.Duration, closed <-chan struct{}) (_ releaseArg, send bool) {
	timer := time.NewTimer(bound)
	defer timer.Stop()
	v.mu.Lock()
	defer v.mu.Unlock()
	wait := true
	for wait && v.per[i].flying > 0 {
		if v.landed == nil {
			v.landed = make(chan struct{})
		}
		landed := v.landed
		v.mu.Unlock()
		select {
		case <-landed:
		case <-timer.C:
			wait = false
		case <-closed:
			wait = false
		}
		v.mu.Lock()
	}
	p := &v.per[i]
	p.awaiting--
	known := a.mine || p.caught
	if p.caught {
		a.clock, a.plain = p.take.clock.Floor(), p.take.plain
	}
	if p.awaiting == 0 {
		p.caught = false
	}
	// Still silent (bound or Close): released as a node of unknown take.
	return a, known || p.unsure || p.flying > 0
}

// releaseCall is the call that releases the votes' hold of key under tok
// on one node, the fence floor kept (see releasePlan); short allows the
// short release script where the node's take fits it. A node whose
// answers are still on their way is waited for up to bound first; a node
// the token never took answers no without a request. The call must then be
// made on every node the plan marked await (a hold with votes is released
// on all nodes): until it is, a late answer from such a node is left to it.
func (s *Store) releaseCall(v *votes, key, tok string, floor uint64, short bool, bound time.Duration) func(ctx context.Context, n *node) (rediskit.ReleaseCode, error) {
	plan := v.releasePlan(floor, len(s.nodes))
	return func(ctx context.Context, n *node) (rediskit.ReleaseCode, error) {
		a := plan[n.index]
		if a.await {
			var send bool
			if a, send = v.await(n.index, a, bound, s.closed); !send {
				return rediskit.ReleaseNotOurs, nil
			}
		} else if a.skip {
			return rediskit.ReleaseNotOurs, nil
		}
		return s.base.Release(ctx, n.c, key, tok, false, a.floor, a.clock, a.plain && short, 0)
	}
}
