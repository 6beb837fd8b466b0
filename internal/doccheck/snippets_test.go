package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// snippetDocs are the documents whose ```go blocks users copy, each with
// the placeholders its blocks take as given: the application's own
// values (a router, a principal, a handler) that a snippet cannot make.
// A block compiles as the body of a function (or, when it is one,
// as declarations), with "..." in a block's prose not allowed: a block is
// Go as written.
var snippetDocs = map[string]string{
	"README.md": `
var (
	ctx        context.Context
	st         storage.Store
	r          chi.Router
	principal  func(*http.Request) string
	placeOrder http.HandlerFunc
	principalOf func(context.Context) string
	addr       string
	reader     *kafka.Reader
	dlqWriter  *kafka.Writer
	ship       func(context.Context, kafkamw.Message) error
	report     func(context.Context, job.Tick) error
	relay      func(context.Context, lock.Lease) error
	sku        string
	guard      *idem.Guard
	shelf      interface {
		Decrement(ctx context.Context, sku string, fence uint64) error
	}
	orderID    string
)`,
	"docs/stock.md": `
var (
	ctx     context.Context
	st      storage.Store
	orderID string
)`,
	"docs/jobs.md": `
var (
	ctx     context.Context
	store   storage.Store
	amount  int
	reports interface {
		Build(ctx context.Context, at time.Time, fence uint64) error
	}
	relay interface{ Loop(ctx context.Context, fence uint64) error }
	payments interface {
		Find(ctx context.Context, key string) (payment, error)
		Charge(ctx context.Context, key string, amount int) (payment, error)
	}
)

type payment interface{ Receipt() []byte }`,
	"docs/middleware.md": `
var (
	ctx            context.Context
	store          storage.Store
	principal      func(context.Context) string
	userOf         func(*http.Request) string
	writeOrder     func(w http.ResponseWriter, key string, fence uint64)
	tenant         string
	idempotencyKey string
	method, route  string
	body, orderJSON []byte
	qty            int
	effect         any
	placeOrder     func(ctx context.Context, body []byte) ([]byte, error)
	addr           string
	brokers        []string
	guard          *idem.Guard
	ship           func(context.Context, kafkamw.Message) error
	dlqWriter, writer *kafka.Writer
	stop           chan struct{}
	orderID        string
	key, fp        string
	g              *idem.Guard
)`,
	"docs/operations.md": `
var client *redis.Client`,
}

// importPaths are the packages a snippet may name, by the name it uses.
var importPaths = map[string]string{
	"context": "context", "errors": "errors", "fmt": "fmt", "http": "net/http", "slog": "log/slog", "sql": "database/sql",
	"time": "time",
	"chi":  "github.com/go-chi/chi/v5", "cron": "github.com/robfig/cron/v3", "gocron": "github.com/go-co-op/gocron/v2",
	"errgroup": "golang.org/x/sync/errgroup", "grpc": "google.golang.org/grpc",
	"insecure": "google.golang.org/grpc/credentials/insecure", "kafka": "github.com/segmentio/kafka-go",
	"prometheus": "github.com/prometheus/client_golang/prometheus", "redis": "github.com/redis/go-redis/v9",
	"retryablehttp": "github.com/hashicorp/go-retryablehttp",
	"gocronjob":     "github.com/oncekit/oncekit/job/gocronjob", "grpcmw": "github.com/oncekit/oncekit/grpcmw",
	"httpmw": "github.com/oncekit/oncekit/httpmw", "idem": "github.com/oncekit/oncekit/core/idem",
	"idemdriver": "github.com/oncekit/oncekit/core/idem/idemdriver",
	"job":        "github.com/oncekit/oncekit/job", "kafkamw": "github.com/oncekit/oncekit/kafkamw",
	"lead": "github.com/oncekit/oncekit/lead", "lock": "github.com/oncekit/oncekit/core/lock",
	"observe": "github.com/oncekit/oncekit/core/observe", "otelobs": "github.com/oncekit/oncekit/observe/otelobs",
	"promobs": "github.com/oncekit/oncekit/observe/promobs", "redisstore": "github.com/oncekit/oncekit/storage/redisstore",
	"sqlstore": "github.com/oncekit/oncekit/storage/sqlstore", "storage": "github.com/oncekit/oncekit/storage",
	"stock": "github.com/oncekit/oncekit/stock",
}

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// Every ```go block of the README and the docs compiles as written, with
// the placeholders above: a user who copies one gets code, not a trap.
func TestSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the snippets with the go command")
	}
	dir, err := os.MkdirTemp(root, "_snippets")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	var pkgs []string
	for doc, placeholders := range snippetDocs {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		blocks := goBlock.FindAllStringSubmatch(string(b), -1)
		if len(blocks) == 0 {
			t.Errorf("%s: no ```go block (a stale entry?)", doc)
			continue
		}
		pkg := strings.NewReplacer("/", "_", ".", "_").Replace(doc)
		pdir := filepath.Join(dir, pkg)
		if err := os.MkdirAll(pdir, 0o755); err != nil {
			t.Fatal(err)
		}
		write := func(name, src string, uses []string) {
			var imports []string
			for _, u := range uses {
				if p, ok := importPaths[u]; ok && !slices.Contains(imports, p) {
					imports = append(imports, p)
				}
			}
			var sb strings.Builder
			fmt.Fprintf(&sb, "package %s\n\n", pkg)
			for _, p := range imports {
				fmt.Fprintf(&sb, "import %q\n", p)
			}
			sb.WriteString(src)
			if err := os.WriteFile(filepath.Join(pdir, name), []byte(sb.String()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write("placeholders.go", placeholders+"\n", qualifiers(t, "package p\n"+placeholders))
		for i, m := range blocks {
			src, uses, err := snippet(m[1], i)
			if err != nil {
				t.Errorf("%s, block %d: %v\n%s", doc, i+1, err, m[1])
				continue
			}
			write(fmt.Sprintf("block%02d.go", i+1), "// "+doc+fmt.Sprintf(", block %d\n", i+1)+src, uses)
		}
		pkgs = append(pkgs, "./"+filepath.Base(dir)+"/"+pkg)
	}
	// In the repository's workspace: the snippets import the adapters that
	// are modules of their own (promobs, otelobs, gocronjob).
	cmd := exec.Command("go", append([]string{"vet"}, pkgs...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOWORK="+workspace(t))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("the documents' Go blocks do not compile (file names: document and block):\n%s", out)
	}
}

// snippet turns block i into a file: its import lines go to the file's
// imports (returned with the package names it uses), declarations stay
// declarations, and statements become a function's body, each variable
// they declare used once more so that a block need not use all it makes.
func snippet(block string, i int) (src string, uses []string, err error) {
	var imports, body []string
	for line := range strings.Lines(block) {
		if strings.HasPrefix(line, "import ") {
			imports = append(imports, line)
			continue
		}
		body = append(body, line)
	}
	code := strings.Join(body, "")
	fset := token.NewFileSet()
	if f, err := parser.ParseFile(fset, "", "package p\n"+code, parser.SkipObjectResolution); err == nil {
		src = strings.Join(imports, "") + code
		return src, selectorNames(f), nil
	}
	wrapped := fmt.Sprintf("package p\nfunc block%02d() error {\n%s\nreturn nil\n}\n", i+1, code)
	f, err := parser.ParseFile(fset, "", wrapped, parser.SkipObjectResolution)
	if err != nil {
		return "", nil, err
	}
	fn := f.Decls[0].(*ast.FuncDecl)
	var declared []string
	for _, stmt := range fn.Body.List {
		switch s := stmt.(type) {
		case *ast.AssignStmt:
			if s.Tok == token.DEFINE {
				for _, l := range s.Lhs {
					if id, ok := l.(*ast.Ident); ok && id.Name != "_" && !slices.Contains(declared, id.Name) {
						declared = append(declared, id.Name)
					}
				}
			}
		case *ast.DeclStmt:
			if g, ok := s.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, spec := range g.Specs {
					for _, id := range spec.(*ast.ValueSpec).Names {
						declared = append(declared, id.Name)
					}
				}
			}
		}
	}
	var use strings.Builder
	for _, d := range declared {
		fmt.Fprintf(&use, "_ = %s\n", d)
	}
	src = strings.Join(imports, "") + fmt.Sprintf("func block%02d() error {\n%s\n%sreturn nil\n}\n", i+1, code, use.String())
	return src, selectorNames(f), nil
}

// selectorNames are the names used as x in x.Sel.
func selectorNames(f *ast.File) []string {
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := s.X.(*ast.Ident); ok && !slices.Contains(names, id.Name) {
				names = append(names, id.Name)
			}
		}
		return true
	})
	return names
}

func qualifiers(t *testing.T, src string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("placeholders: %v", err)
	}
	return selectorNames(f)
}

// httpAnswer is "<status> <code>" as the documents write an answer of
// httpmw's: 409 `request_in_flight`, or 409 request_in_flight.
var httpAnswer = regexp.MustCompile("\\b([1-5][0-9][0-9])\\s+`?([a-z]+(?:_[a-z]+)+)`?")

// The HTTP middleware's answers are written for two readers: the package
// documentation (go doc, pkg.go.dev) and docs/middleware.md's table.
// Both name every problem code httpmw answers with, each with the same
// status, so neither can drift from the code or from the other.
func TestHTTPAnswersAgree(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(root, "httpmw/problem.go"))
	if err != nil {
		t.Fatal(err)
	}
	codes := regexp.MustCompile(`Code\w+\s*=\s*"([a-z_]+)"`).FindAllStringSubmatch(string(src), -1)
	if len(codes) < 8 {
		t.Fatalf("found %d problem codes in httpmw/problem.go", len(codes))
	}
	answers := func(doc string) map[string]string {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(b), "\n//", "")
		out := map[string]string{}
		for _, m := range httpAnswer.FindAllStringSubmatch(text, -1) {
			out[m[2]] = m[1]
		}
		return out
	}
	godoc, guide := answers("httpmw/doc.go"), answers("docs/middleware.md")
	for _, c := range codes {
		code := c[1]
		switch g, d := godoc[code], guide[code]; {
		case g == "":
			t.Errorf("httpmw/doc.go does not say which status answers %s", code)
		case d == "":
			t.Errorf("docs/middleware.md does not say which status answers %s", code)
		case g != d:
			t.Errorf("%s is %s in httpmw/doc.go and %s in docs/middleware.md", code, g, d)
		}
	}
}
