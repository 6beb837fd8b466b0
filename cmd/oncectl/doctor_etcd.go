package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/storage/etcdstore"
)

// etcdStore is an etcdstore Store (doctor reads its client).
type etcdStore interface{ Client() etcdstore.Client }

// diagnoseEtcd judges an etcd cluster: its members, each endpoint's
// status (the leader, alarms that refuse writes).
func diagnoseEtcd(ctx context.Context, s etcdStore, ttl time.Duration) (*diagnosis, error) {
	c, ok := s.Client().(*clientv3.Client)
	if !ok {
		return nil, fmt.Errorf("no checks for a %T (doctor reads a *clientv3.Client)", s.Client())
	}
	members, err := c.MemberList(ctx)
	if err != nil {
		return nil, err
	}
	d := &diagnosis{}
	var leaders []uint64
	var version string
	for _, ep := range c.Endpoints() {
		st, err := c.Status(ctx, ep)
		if err != nil {
			d.fact("endpoint "+ep, "unreachable: %v", err)
			continue
		}
		version = st.Version
		leaders = append(leaders, st.Leader)
		d.fact("endpoint "+ep, "leader %x, raft term %d, db %d bytes", st.Leader, st.RaftTerm, st.DbSize)
	}
	alarms, err := c.AlarmList(ctx)
	if err != nil {
		return nil, err
	}
	var raised []string
	for _, a := range alarms.Alarms {
		raised = append(raised, a.Alarm.String())
	}
	// etcd raises a lease's TTL to its minimum, 1.5 election timeouts:
	// ask for one second and see what it grants.
	var granted time.Duration
	if l, err := c.Grant(ctx, 1); err == nil {
		granted = time.Duration(l.TTL) * time.Second
		_, _ = c.Revoke(ctx, l.ID)
	} else {
		return nil, err
	}
	offset, clockErr := etcdClock(ctx, c)
	n := len(members.Members)
	d.fact("version", "%s", version)
	d.fact("members / quorum", "%d / %d", n, n/2+1)
	d.fact("alarms", "%s", strings.Join(append(raised, "none")[:max(1, len(raised))], ", "))
	d.fact("lease TTL granted for 1s asked", "%v (etcd's minimum: 1.5 election timeouts)", granted)
	if clockErr != nil {
		d.fact("clock offset (server − this machine)", "unknown: %v", clockErr)
	} else {
		d.fact("clock offset (server − this machine)", "%v (to the second: the HTTP Date header)", offset.Round(time.Second))
	}
	agree := true
	for _, l := range leaders {
		agree = agree && l == leaders[0] && l != 0
	}
	members1 := when(n < 3, holdsIf, fmt.Sprintf("its %d member(s) stay up: a cluster of %d tolerates no failure", n, n), "run 3 or 5 members")
	even := when(n >= 4 && n%2 == 0, holdsIf, fmt.Sprintf("no more than %d of the %d members fail: an even count tolerates no more failures than one member fewer", (n-1)/2, n), "run an odd number of members")
	alarm := when(len(raised) > 0, holdsIf, "writes are refused while the alarm is raised ("+strings.Join(raised, ", ")+"): every acquisition and claim fails", "etcdctl alarm disarm, after compacting and defragmenting (NOSPACE)")
	leader := when(!agree || len(leaders) == 0, holdsIf, "the cluster elects a leader: the endpoints do not agree on one now", "check the members' health: etcdctl endpoint health")
	d.judge(promiseExclusion, "Raft: every grant a quorum write", alarm, leader, members1, even)
	d.judge(promiseFences, "fences are revisions, which never go back")
	d.judge(promiseOnce, "a run's record and its effect commit in one transaction", alarm)
	d.judge(promiseDeadFrees, "a dead holder's entries go with its session's lease, by the leader's clock",
		when(granted > ttl, holdsIf, fmt.Sprintf("a dead holder's key may stay taken for %v, not the %v TTL (--ttl): etcd raises a lease to 1.5 election timeouts", granted, ttl),
			fmt.Sprintf("use TTLs of at least %v, or lower the members' --election-timeout", granted)))
	d.judge(promiseRetry, "attempts are counted beside the record")
	return d, nil
}

// etcdClock reads the first endpoint's clock from the Date header of its
// /version answer (etcd's HTTP and gRPC share the client port).
func etcdClock(ctx context.Context, c *clientv3.Client) (time.Duration, error) {
	eps := c.Endpoints()
	if len(eps) == 0 {
		return 0, errors.New("no endpoint")
	}
	ep := eps[0]
	if !strings.Contains(ep, "://") {
		ep = "http://" + ep
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep+"/version", nil)
	if err != nil {
		return 0, err
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	if strings.HasPrefix(ep, "https://") {
		return 0, errors.New("not read over TLS")
	}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	at, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return 0, err
	}
	// The header is to the second: compare with the middle of the request,
	// rounded down as the server's is.
	mid := start.Add(time.Since(start) / 2).Truncate(time.Second)
	return at.Sub(mid), nil
}
