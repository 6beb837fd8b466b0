package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"
)

// zkStore is a zkstore Store (doctor reads the session timeout it asked
// for; the members come from the URL).
type zkStore interface{ SessionTimeout() time.Duration }

// zkSrvr asks a member for its mode (leader, follower, standalone) and
// version with the four-letter word srvr.
func zkSrvr(host string, timeout time.Duration) (mode, version string, err error) {
	c, err := net.DialTimeout("tcp", host, timeout)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("srvr")); err != nil {
		return "", "", err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return "", "", err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Mode: "); ok {
			mode = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "Zookeeper version: "); ok {
			version = strings.SplitN(v, "-", 2)[0]
		}
	}
	if mode == "" {
		return "", "", fmt.Errorf("answered %q", strings.TrimSpace(string(b)))
	}
	return mode, version, nil
}

// diagnoseZK judges a ZooKeeper ensemble: its members' modes (srvr, one of
// the four-letter words a server must allow: 4lw.commands.whitelist).
func diagnoseZK(ctx context.Context, s zkStore, rawURL string) (*diagnosis, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	hosts := strings.Split(u.Host, ",")
	timeout := 2 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	d := &diagnosis{}
	leaders, reachable := 0, 0
	for _, h := range hosts {
		mode, version, err := zkSrvr(h, timeout)
		if err != nil {
			d.fact("member "+h, "no answer to srvr: %v (allow it: 4lw.commands.whitelist=srvr)", err)
			continue
		}
		reachable++
		if mode == "leader" || mode == "standalone" {
			leaders++
		}
		d.fact("member "+h, "%s, %s", mode, version)
	}
	n := len(hosts)
	d.fact("members in the URL / answering", "%d / %d", n, reachable)
	d.fact("session timeout asked", "%v (the servers keep it within 2 and 20 ticks)", s.SessionTimeout())
	small := when(n < 3, holdsIf, fmt.Sprintf("the %d member(s) the URL names stay up: this client knows no other, so it tolerates no failure", n), "name every member of an ensemble of 3 or 5")
	even := when(n >= 4 && n%2 == 0, holdsIf, fmt.Sprintf("no more than %d of the %d members fail: an even count tolerates no more failures than one member fewer", (n-1)/2, n), "run an odd number of members")
	leader := when(leaders > 1 || (reachable == n && n >= 3 && leaders == 0), holdsIf, fmt.Sprintf("the ensemble settles on one leader: %d of the members answering say they lead", leaders), "check the members: echo srvr | nc host port")
	d.judge(promiseExclusion, "Zab: every acquisition a quorum write", leader, small, even)
	d.judge(promiseFences, "fences are zxids, which never go back")
	d.judge(promiseOnce, "a run's record and its effect commit in one multi-operation")
	d.judge(promiseDeadFrees, "a dead holder's nodes go with its session, within the negotiated session timeout (not the TTL)")
	d.judge(promiseRetry, "attempts are counted in the record")
	return d, nil
}
