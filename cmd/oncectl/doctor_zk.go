package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
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

// zkNegotiated opens a session of its own asking for asked and returns
// the timeout the servers granted. go-zookeeper keeps that to itself but
// logs it ("authenticated: id=…, timeout=…"), so doctor reads its log.
func zkNegotiated(hosts []string, asked, wait time.Duration) (time.Duration, error) {
	got := make(chan time.Duration, 1)
	l := zkLogFunc(func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		if i := strings.Index(line, "timeout="); i >= 0 && strings.HasPrefix(line, "authenticated") {
			if ms, err := strconv.Atoi(strings.TrimSpace(line[i+len("timeout="):])); err == nil {
				select {
				case got <- time.Duration(ms) * time.Millisecond:
				default:
				}
			}
		}
	})
	conn, _, err := zk.Connect(hosts, asked, zk.WithLogger(l))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	select {
	case d := <-got:
		return d, nil
	case <-time.After(wait):
		return 0, fmt.Errorf("no ZooKeeper session within %v", wait)
	}
}

type zkLogFunc func(format string, args ...any)

func (f zkLogFunc) Printf(format string, args ...any) { f(format, args...) }

// diagnoseZK judges a ZooKeeper ensemble: its members' modes (srvr, one of
// the four-letter words a server must allow: 4lw.commands.whitelist).
func diagnoseZK(ctx context.Context, s zkStore, rawURL string, ttl time.Duration) (*diagnosis, error) {
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
	asked := s.SessionTimeout()
	negotiated, err := zkNegotiated(hosts, asked, timeout)
	if err != nil {
		return nil, err
	}
	d.fact("session timeout asked / granted", "%v / %v (the servers keep it within their minSessionTimeout and maxSessionTimeout)", asked, negotiated)
	// A holder paused or cut off for longer than its session loses its
	// key when the servers expire the session, while its lease runs on to
	// its TTL: a session granted shorter than the one asked shortens
	// what a lease can safely be.
	shorter := when(negotiated < asked, holdsIf,
		fmt.Sprintf("TTLs stay at most %v: the servers granted a session of %v for the %v asked (their maxSessionTimeout), and a holder paused or cut off for longer loses its key while its lease runs on to its TTL", negotiated, negotiated, asked),
		fmt.Sprintf("ask for what the servers grant (session_timeout=%v, zkstore.WithSessionTimeout) or raise their maxSessionTimeout; keep TTLs at most the session, and pass fences to the resource", negotiated))
	paused := when(ttl > negotiated, holdsIf,
		fmt.Sprintf("no holder pauses or is cut off for longer than its %v session: then the servers free its key while its lease runs on to the %v TTL (--ttl)", negotiated, ttl),
		fmt.Sprintf("keep TTLs at most the session (%v), and pass fences to the resource", negotiated))
	longer := when(negotiated > asked, holdsIf,
		fmt.Sprintf("a dead holder's key may stay taken for %v, the session the servers granted (their minSessionTimeout), not the %v asked", negotiated, asked),
		fmt.Sprintf("ask at least %v, or lower the servers' minSessionTimeout", negotiated))
	small := when(n < 3, holdsIf, fmt.Sprintf("the %d member(s) the URL names stay up: this client knows no other, so it tolerates no failure", n), "name every member of an ensemble of 3 or 5")
	even := when(n >= 4 && n%2 == 0, holdsIf, fmt.Sprintf("no more than %d of the %d members fail: an even count tolerates no more failures than one member fewer", (n-1)/2, n), "run an odd number of members")
	leader := when(leaders > 1 || (reachable == n && n >= 3 && leaders == 0), holdsIf, fmt.Sprintf("the ensemble settles on one leader: %d of the members answering say they lead", leaders), "check the members: echo srvr | nc host port")
	d.judge(promiseExclusion, "Zab: every acquisition a quorum write", shorter, paused, leader, small, even)
	d.judge(promiseFences, "fences are zxids, which never go back")
	d.judge(promiseOnce, "a run's record and its effect commit in one multi-operation")
	d.judge(promiseDeadFrees, fmt.Sprintf("a dead holder's nodes go with its session, within %v (the session timeout, not the TTL)", negotiated), longer)
	d.judge(promiseRetry, "attempts are counted in the record")
	return d, nil
}
