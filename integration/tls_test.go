package integration_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage"
)

// Credentials and TLS pass through the drivers and oncectl: a Redis with
// an ACL user and TLS only (three of them for Redlock), and an etcd with
// authentication and TLS, with certificates this test makes. Without the
// credentials or the CA, nothing gets through.
func TestCredentialsAndTLS(t *testing.T) {
	testenv.NeedCommand(t, "redis-server")
	testenv.QuietRedisDialErrors() // the refused attempts below are on purpose
	certs := makeCerts(t)
	t.Run("redis", func(t *testing.T) {
		addr := startTLSRedis(t, certs)
		good := fmt.Sprintf("rediss://alice:s3cret@%s?ca=%s", addr, url.QueryEscape(certs.ca))
		useStore(t, good)
		oncectl(t, good, 0)
		for name, bad := range map[string]string{
			"wrong password": fmt.Sprintf("rediss://alice:wrong@%s?ca=%s", addr, url.QueryEscape(certs.ca)),
			"no password":    fmt.Sprintf("rediss://%s?ca=%s", addr, url.QueryEscape(certs.ca)),
			"untrusted CA":   fmt.Sprintf("rediss://alice:s3cret@%s", addr),
			"no TLS":         fmt.Sprintf("redis://alice:s3cret@%s", addr),
		} {
			if err := tryStore(bad); err == nil {
				t.Errorf("%s: the store answered", name)
			}
		}
	})
	t.Run("redlock", func(t *testing.T) {
		var addrs []string
		for range 3 {
			addrs = append(addrs, startTLSRedis(t, certs))
		}
		good := fmt.Sprintf("redlock://alice:s3cret@%s?ca=%s", strings.Join(addrs, ","), url.QueryEscape(certs.ca))
		useStore(t, good)
		oncectl(t, good, 0)
		if err := tryStore(fmt.Sprintf("redlock://alice:wrong@%s?ca=%s", strings.Join(addrs, ","), url.QueryEscape(certs.ca))); err == nil {
			t.Error("wrong password: the store answered")
		}
	})
	t.Run("etcd", func(t *testing.T) {
		testenv.NeedCommand(t, "etcd")
		addr := startTLSEtcd(t, certs)
		good := fmt.Sprintf("etcd://root:rootpw@%s?ca=%s", addr, url.QueryEscape(certs.ca))
		useStore(t, good)
		oncectl(t, good, 0)
		for name, bad := range map[string]string{
			"wrong password": fmt.Sprintf("etcd://root:nope@%s?ca=%s", addr, url.QueryEscape(certs.ca)),
			"no credentials": fmt.Sprintf("etcd://%s?ca=%s", addr, url.QueryEscape(certs.ca)),
			"untrusted CA":   fmt.Sprintf("etcd://root:rootpw@%s", addr),
		} {
			if err := tryStore(bad); err == nil {
				t.Errorf("%s: the store answered", name)
			}
		}
	})
}

// useStore takes a lock and runs a key once through the store at url.
func useStore(t *testing.T, url string) {
	t.Helper()
	o, err := storage.Open(context.Background(), url, storage.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// (Open dials nothing: the first request dials each node. A 10 s lease
	// gives Redlock's first round a node timeout of 1 s for a TLS
	// handshake under the race detector.)
	l, err := o.TryAcquire(ctx, "tls-lock", 10*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	g, err := idem.NewGuard(o)
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("tls-%d", time.Now().UnixNano())
	for i := range 2 {
		res, replayed, err := g.Do(ctx, key, "fp", func(context.Context) ([]byte, error) { return []byte("done"), nil })
		if err != nil || string(res) != "done" || replayed != (i == 1) {
			t.Fatalf("Do #%d: %q %v %v", i+1, res, replayed, err)
		}
	}
}

// tryStore reports whether the store at url answers a claim.
func tryStore(url string) error {
	o, err := storage.Open(context.Background(), url, storage.WithTimeout(2*time.Second))
	if err != nil {
		return err
	}
	defer o.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = o.TryAcquire(ctx, fmt.Sprintf("tls-probe-%d", time.Now().UnixNano()), time.Second)
	return err
}

// oncectl runs `oncectl lock inspect` against url and checks its exit code.
func oncectl(t *testing.T, url string, want int) {
	t.Helper()
	cmd := exec.Command(oncectlBin, "--store", url, "--timeout", "10s", "lock", "inspect", "tls-lock")
	out, err := cmd.CombinedOutput()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if code != want {
		t.Errorf("oncectl lock inspect: exit %d, want %d:\n%s", code, want, out)
	}
}

type certFiles struct{ ca, cert, key string }

// makeCerts writes a CA and a server certificate for 127.0.0.1.
func makeCerts(t *testing.T) certFiles {
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "oncekit test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	f := certFiles{ca: filepath.Join(dir, "ca.pem"), cert: filepath.Join(dir, "server.pem"), key: filepath.Join(dir, "server-key.pem")}
	for path, block := range map[string]*pem.Block{
		f.ca: {Type: "CERTIFICATE", Bytes: caDER}, f.cert: {Type: "CERTIFICATE", Bytes: srvDER}, f.key: {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func freeAddr(t *testing.T) (string, int) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := l.Addr().(*net.TCPAddr).Port
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), p
}

// startTLSRedis starts a redis-server that speaks only TLS and knows one
// ACL user, alice (the default user is off).
func startTLSRedis(t *testing.T, c certFiles) string {
	addr, port := freeAddr(t)
	dir := t.TempDir()
	cmd := exec.Command("redis-server", "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", c.cert, "--tls-key-file", c.key, "--tls-ca-cert-file", c.ca, "--tls-auth-clients", "no",
		"--user", "default", "off", "--user", "alice", "on", ">s3cret", "~*", "&*", "+@all",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(c.ca)
	pool.AppendCertsFromPEM(caPEM)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{RootCAs: pool})
		if err == nil {
			conn.Close()
			return addr
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("TLS redis-server not ready: %v\n%s", err, log)
		}
	}
}

// startTLSEtcd starts a single etcd serving clients over TLS, with
// authentication on and one user, root.
func startTLSEtcd(t *testing.T, c certFiles) string {
	addr, _ := freeAddr(t)
	peer, _ := freeAddr(t)
	dir := t.TempDir()
	cmd := exec.Command("etcd", "--name", "tls", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", "https://"+addr, "--advertise-client-urls", "https://"+addr,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "tls=http://"+peer, "--cert-file", c.cert, "--key-file", c.key)
	logf, _ := os.Create(filepath.Join(dir, "etcd.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); logf.Close() })
	conf, err := tlsConfigFor(c.ca)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, TLS: conf, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, err := cli.Get(ctx, "health"); err == nil {
			break
		}
		if ctx.Err() != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "etcd.log"))
			t.Fatalf("TLS etcd not ready:\n%s", log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := cli.UserAdd(ctx, "root", "rootpw"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	return addr
}

func tlsConfigFor(ca string) (*tls.Config, error) {
	pemBytes, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemBytes)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
