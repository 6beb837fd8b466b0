package doccheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	_ "github.com/oncekit/oncekit/storage/all"
	"github.com/oncekit/oncekit/storage/driver"
)

// root is the repository's root, two levels up from this package.
const root = "../.."

// drivers are the driver packages oncekit ships, as they registered
// themselves (storage/all imports every one): a driver added without its
// name in every driver list of the documents fails
// TestDriverListsAreComplete.
var drivers = func() []string {
	var names []string
	for _, d := range driver.Drivers() {
		names = append(names, d.Package)
	}
	return names
}()

// documents are the Markdown files and package documentation users read,
// by path from the root. The benchmark pages compare the drivers that were
// measured, and the changelog records what changed: neither lists drivers.
func documents(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if name := d.Name(); rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case rel == "CHANGELOG.md", rel == "BENCHMARKS.md", strings.HasPrefix(rel, "docs/benchmarks"):
		case strings.HasSuffix(rel, ".md"), filepath.Base(rel) == "doc.go":
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("found %d documents under %s: the walk looks in the wrong place", len(files), root)
	}
	return files
}

// paragraphSep splits a document into paragraphs: blank lines (also inside
// Go comments) and the start of each list item.
var paragraphSep = regexp.MustCompile(`\n[ \t]*(//)?[ \t]*\n|\n[ \t]*(//)?[ \t]*[-*] `)

// A paragraph (or table, or list item) that names four or more of the
// drivers' packages is a list of drivers, and must name all of them: the
// lists went stale twice when a driver was added. (Three are a comparison,
// such as the drivers that keep hot keys in the process.) A package's own doc
// counts its name as present; a list of the stores that commit an effect
// with the record leaves out redlockstore, which has none.
func TestDriverListsAreComplete(t *testing.T) {
	for _, file := range documents(t) {
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		own := filepath.Base(filepath.Dir(file))
		for _, p := range paragraphSep.Split(string(b), -1) {
			var named, missing []string
			for _, d := range drivers {
				if strings.Contains(p, d) || d == own {
					named = append(named, d)
				} else if !(d == "redlockstore" && strings.Contains(p, "Effect")) {
					missing = append(missing, d)
				}
			}
			if len(named) >= 4 && len(missing) > 0 {
				t.Errorf("%s: a list of drivers leaves out %s:\n%s", file, strings.Join(missing, ", "), excerpt(p))
			}
		}
	}
}

func excerpt(p string) string {
	p = strings.TrimSpace(p)
	if len(p) > 300 {
		p = p[:300] + "…"
	}
	return p
}

// The README is what a new user reads first, whole: at most 12 KB.
func TestReadmeIsShort(t *testing.T) {
	fi, err := os.Stat(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 12<<10 {
		t.Errorf("README.md is %d bytes; keep it within 12 KB (move detail to docs/)", fi.Size())
	}
}

// Every library package has its documentation in a doc.go (commands keep
// theirs in main.go; generated code has none).
func TestEveryPackageHasDocGo(t *testing.T) {
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
			return filepath.SkipDir
		}
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		hasGo, hasDoc, exempt := false, false, false
		for _, e := range entries {
			n := e.Name()
			if strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
				hasGo = true
				b, err := os.ReadFile(filepath.Join(path, n))
				if err != nil {
					return err
				}
				exempt = exempt || strings.HasSuffix(n, ".pb.go") || regexp.MustCompile(`(?m)^package main$`).Match(b)
			}
			hasDoc = hasDoc || n == "doc.go"
		}
		if hasGo && !hasDoc && !exempt {
			rel, _ := filepath.Rel(root, path)
			t.Errorf("%s has Go code but no doc.go", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The package documentation of storage shows every URL form a registered
// driver's usage names (driver.Info.Usage, the source of storage.Help).
func TestStorageDocNamesEveryForm(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "storage/doc.go"))
	if err != nil {
		t.Fatal(err)
	}
	form := regexp.MustCompile(`(?m)^\s+([a-z-]+://)`)
	for _, d := range driver.Drivers() {
		for _, m := range form.FindAllStringSubmatch(d.Usage, -1) {
			if !strings.Contains(string(doc), "//\t"+m[1]) {
				t.Errorf("storage/doc.go does not show %s's form %s", d.Package, m[1])
			}
		}
	}
}
