package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// goFiles parses the module's library Go files (no tests, no generated
// code, nothing under testdata or the bench module) with their comments,
// by path from the root.
func goFiles(t *testing.T) map[string]*ast.File {
	t.Helper()
	files := map[string]*ast.File{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bench") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		files[rel] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// exported maps each of the module's package names to the names it
// exports: its top-level identifiers, and "Type.Member" for the methods
// and fields of its types.
func exported(files map[string]*ast.File) map[string]map[string]bool {
	pkgs := map[string]map[string]bool{}
	for _, f := range files {
		names := pkgs[f.Name.Name]
		if names == nil {
			names = map[string]bool{}
			pkgs[f.Name.Name] = names
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					names[d.Name.Name] = true
					continue
				}
				typ := d.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if ix, ok := typ.(*ast.IndexExpr); ok {
					typ = ix.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					names[id.Name+"."+d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						names[s.Name.Name] = true
						members := func(fl *ast.FieldList) {
							for _, f := range fl.List {
								for _, n := range f.Names {
									names[s.Name.Name+"."+n.Name] = true
								}
								if len(f.Names) == 0 { // embedded: its members are promoted
									names[s.Name.Name+".*"] = true
								}
							}
						}
						switch ty := s.Type.(type) {
						case *ast.StructType:
							members(ty.Fields)
						case *ast.InterfaceType:
							members(ty.Methods)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							names[n.Name] = true
						}
					}
				}
			}
		}
	}
	return pkgs
}

// reference is pkg.Name or pkg.Type.Member in a comment or a document.
var reference = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?`)

// Names of this module's packages that other libraries use too, whose
// references in the documents may be to those (database/sql/driver,
// go-redis' redis, gocron).
var ambiguous = map[string]bool{"driver": true, "all": true, "app": true, "main": true}

// Every reference to one of the module's packages in the package
// documentation and the documents (httpmw.WithKeyHeader,
// lock.Held.Refresh) names something the package exports: a renamed or
// removed function leaves no document pointing at it.
func TestReferencesExist(t *testing.T) {
	files := goFiles(t)
	pkgs := exported(files)
	check := func(file, text string) {
		for _, m := range reference.FindAllStringSubmatch(text, -1) {
			names, ours := pkgs[m[1]]
			if !ours || ambiguous[m[1]] {
				continue
			}
			if !names[m[2]] {
				t.Errorf("%s: %s.%s does not exist", file, m[1], m[2])
				continue
			}
			if m[3] != "" && !names[m[2]+"."+m[3]] && !names[m[2]+".*"] {
				t.Errorf("%s: %s.%s.%s does not exist", file, m[1], m[2], m[3])
			}
		}
	}
	for _, file := range documents(t) {
		if strings.HasSuffix(file, ".go") {
			continue // below, with every Go file's comments
		}
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		check(file, string(b))
	}
	for file, f := range files {
		for _, cg := range f.Comments {
			check(file, cg.Text())
		}
	}
}
