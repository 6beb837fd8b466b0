package app

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The demo `make run` runs: three replicas on the embedded store and
// broker, a flash sale, a passing report.
func TestDemo(t *testing.T) {
	var stdout, stderr bytes.Buffer
	html := filepath.Join(t.TempDir(), "report.html")
	code := run([]string{"--demo", "--store", "memory://", "--kafka", "embedded", "--buyers", "300", "--stock", "40", "--html", html}, &stdout, &stderr, Options{})
	// Every order shipped; fewer than 40 when buyers let their holds run
	// out after the others were told sold out.
	m := regexp.MustCompile(`shipments / orders +(\d+) / (\d+)`).FindStringSubmatch(stdout.String())
	if code != 0 || !strings.Contains(stdout.String(), "PASS") || m == nil || m[1] != m[2] || !strings.Contains(stdout.String(), "holds: paid / let run out") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	if b, err := os.ReadFile(html); err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Errorf("HTML report: %v", err)
	}
}

// --demo --kafka "" sells without Kafka, as the flag's help says (without
// the flag the demo starts an embedded broker).
func TestDemoWithoutKafka(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"--demo", "--store", "memory://", "--kafka", "", "--buyers", "60", "--stock", "10"}, &stdout, &stderr, Options{})
	if code != 0 || !strings.Contains(stdout.String(), "PASS") || !strings.Contains(stderr.String(), "kafka none") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
}

// A bad store URL or an unreachable server is one clear line and exit 1.
func TestBadStore(t *testing.T) {
	for url, want := range map[string]string{
		"bogus://x":           `store URL scheme "bogus" is not supported`,
		"redis://127.0.0.1:1": "store redis://127.0.0.1:1 is unreachable",
		"redis-cluster://":    "names no host",
		"memory://x":          "memory:// takes no host",
	} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"--store", url, "--kafka", ""}, &stdout, &stderr, Options{})
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if code != 1 || len(lines) != 1 || !strings.Contains(lines[0], want) {
			t.Errorf("--store %s: exit %d, stderr %q; want one line with %q", url, code, stderr.String(), want)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--replicas", "0"}, &stdout, &stderr, Options{}); code != 2 {
		t.Errorf("--replicas 0: exit %d", code)
	}
}
