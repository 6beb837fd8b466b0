package doccheck

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// exportedNames counts what a package's godoc page lists: its exported
// constants, variables, functions, types, and the types' functions and
// methods.
func exportedNames(t *testing.T, dir string) int {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != filepath.Join(root, dir) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		files = append(files, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p, err := doc.NewFromFiles(fset, files, "example.com/"+dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			for _, name := range v.Names {
				if ast.IsExported(name) {
					n++
				}
			}
		}
	}
	values(p.Consts)
	values(p.Vars)
	n += len(p.Funcs)
	for _, ty := range p.Types {
		n++
		values(ty.Consts)
		values(ty.Vars)
		n += len(ty.Funcs) + len(ty.Methods)
	}
	return n
}

// The user packages' godoc pages show what users call: the driver
// contracts live in idemdriver and lockdriver. Their size may only
// shrink (the aim is 40 each); CONTRIBUTING.md tables the counts.
func TestUserPagesStaySmall(t *testing.T) {
	for dir, most := range map[string]int{"core/idem": 40, "core/lock": 40} {
		if n := exportedNames(t, dir); n > most {
			t.Errorf("%s exports %d names, more than its %d: does the new one belong in the driver package?", dir, n, most)
		} else {
			t.Logf("%s: %d names", dir, n)
		}
	}
}
