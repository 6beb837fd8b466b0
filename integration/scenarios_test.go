package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/oncekit/oncekit/examples/inventory/flashsale"
	"github.com/oncekit/oncekit/internal/testenv"
)

// Three replica processes on one store and one broker, buyers over HTTP
// and gRPC, many of them sending their order twice to two replicas at once.
func TestFlashSaleAcrossProcesses(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		d := deploy(t, url, 3)
		rep := d.sale(600, 150, 0.4)
		d.check(rep)
		if rep.Replays == 0 {
			t.Error("no replays: the duplicates did not meet")
		}
	})
}

// A replica killed with SIGKILL in the middle of a burst of duplicated
// orders: its clients retry on the other replicas with the same keys, and
// every key still sells once.
func TestReplicaKilledMidBurst(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		d := deploy(t, url, 3)
		done := make(chan *flashsale.Report, 1)
		go func() { done <- d.sale(1500, 400, 0.5) }()
		at := d.waitOrders(30)
		d.replicas[1].kill()
		t.Logf("replica 2 killed after %d orders", at)
		rep := <-done
		d.check(rep)
		if at >= rep.Stock {
			t.Errorf("the kill came after the sale (%d orders)", at)
		}
	})
}

// The store killed and restarted (with its data: an append-only file
// synced on every write) in the middle of the sale: the replicas answer
// 503 meanwhile, the clients retry, and nothing is oversold or lost.
func TestStoreRestartedMidSale(t *testing.T) {
	srv := testenv.StartDurableRedis(t)
	d := deploy(t, "redis://"+srv.Addr, 3)
	done := make(chan *flashsale.Report, 1)
	go func() { done <- d.sale(1200, 300, 0.4) }()
	at := d.waitOrders(30)
	srv.Kill()
	time.Sleep(time.Second)
	srv.Start()
	t.Logf("store restarted after %d orders", at)
	rep := <-done
	d.check(rep)
	if rep.Retried == 0 {
		t.Error("no answer said to retry while the store was down")
	}
}

// The flash sale on a Redis Cluster whose shard serving the SKU loses its
// primary (SIGKILL) mid-sale. Every sale's record is placed in the SKU's
// slot, with the stock, the order and the outbox entry it commits with,
// and every grant waits for one replica's acknowledgement (replicas=1):
// the replica the cluster promotes has every sale that was answered. The
// replicas answer 503 meanwhile, the clients retry, and nothing is
// oversold, lost or sold twice; every order ships once.
func TestClusterPrimaryKilledMidSale(t *testing.T) {
	rc := testenv.StartRedisCluster(t, 3, 2) // the shard keeps a replica after its failover
	d := deploy(t, "redis-cluster://"+strings.Join(rc.Addrs(), ",")+"?replicas=1&replica_timeout=1s", 3)
	sku := fmt.Sprintf("flash-%d", time.Now().UnixNano())
	done := make(chan *flashsale.Report, 1)
	go func() { done <- d.saleOf(sku, 1200, 300, 0.4) }()
	at := d.waitOrders(30)
	primary := rc.PrimaryOf("{" + sku + "}")
	primary.Kill()
	promoted := rc.WaitFailover("{"+sku+"}", primary, 30*time.Second)
	t.Logf("%s (the SKU's primary) killed after %d orders; %s promoted", primary.Addr, at, promoted.Addr)
	rep := <-done
	d.check(rep)
	if at >= rep.Stock {
		t.Errorf("the kill came after the sale (%d orders)", at)
	}
}

// A readiness probe follows the store: the replica's grpc.health.v1 Check
// (as Kubernetes' grpc probe calls it, with no idempotency key) and GET
// /healthz say SERVING while its Redis answers, NOT_SERVING and 503 while
// it is down, and SERVING again once it is back.
func TestHealthFollowsTheStore(t *testing.T) {
	srv := testenv.StartRedis(t)
	d := deploy(t, "redis://"+srv.Addr, 1)
	conn, err := grpc.NewClient(d.grpcTargets[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	probe := func() (healthpb.HealthCheckResponse_ServingStatus, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		code := 0
		if r, err := http.Get(d.httpTargets[0] + "/healthz"); err == nil {
			code = r.StatusCode
			r.Body.Close()
		}
		return resp.GetStatus(), code
	}
	if st, code := probe(); st != healthpb.HealthCheckResponse_SERVING || code != http.StatusOK {
		t.Fatalf("with the store up: %v, /healthz %d", st, code)
	}
	srv.Kill()
	if st, code := probe(); st != healthpb.HealthCheckResponse_NOT_SERVING || code != http.StatusServiceUnavailable {
		t.Errorf("with the store down: %v, /healthz %d", st, code)
	}
	srv.Start()
	deadline := time.Now().Add(30 * time.Second)
	for st, code := probe(); st != healthpb.HealthCheckResponse_SERVING || code != http.StatusOK; st, code = probe() {
		if time.Now().After(deadline) {
			t.Fatalf("the store back for 30 s: %v, /healthz %d", st, code)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
