package doccheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// workspace is the path of a go.work over every module of the repository
// (scripts/workspace.sh).
func workspace(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(root, "scripts", "workspace.sh")).Output()
	if err != nil {
		t.Fatalf("scripts/workspace.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// A program that uses oncekit's lock, a Redis store and the HTTP
// middleware pulls none of the integrations it does not use: no
// OpenTelemetry, Prometheus, franz-go or gocron module is in its module
// graph (they are the adapters' modules' requirements, not the main
// module's), so they can neither bloat its build nor raise its own
// versions of them.
func TestLightModuleGraph(t *testing.T) {
	if testing.Short() {
		t.Skip("resolves a module graph with the go command")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/light\n\ngo 1.26.0\n\nrequire github.com/oncekit/oncekit v0.0.0-00010101000000-000000000000\n\n" +
			"replace github.com/oncekit/oncekit => " + abs + "\n",
		"main.go": `package main

import (
	_ "github.com/oncekit/oncekit/core/lock"
	_ "github.com/oncekit/oncekit/httpmw"
	_ "github.com/oncekit/oncekit/storage/redisstore"
)

func main() {}
`,
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gocmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	gocmd("mod", "tidy")
	gocmd("build", "./...")
	all := gocmd("list", "-m", "all")
	for _, heavy := range []string{"go.opentelemetry.io/", "github.com/prometheus/", "github.com/twmb/franz-go", "github.com/go-co-op/gocron"} {
		for line := range strings.Lines(all) {
			if strings.HasPrefix(line, heavy) {
				t.Errorf("the module graph of a program using lock, redisstore and httpmw names %s", strings.TrimSpace(line))
			}
		}
	}
	t.Logf("%d modules in the graph", strings.Count(all, "\n"))
}
