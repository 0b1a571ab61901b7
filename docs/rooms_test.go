package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function outside tests and generated code
// may be; STYLE.md asks for functions a reader can hold at once.
const maxFuncLines = 120

// TestEveryPackageHasItsDocAndShortFunctions: every package of the module
// states its contract in a package doc comment placed before its package
// clause, and no function outside tests and generated code is longer
// than maxFuncLines.
func TestEveryPackageHasItsDocAndShortFunctions(t *testing.T) {
	root := ".."
	fset := token.NewFileSet()
	packages, documented := map[string]bool{}, map[string]bool{}
	var long []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", "testdata", ".git", "gen":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, p, src, parser.ParseComments)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" && filepath.Dir(p) == root {
			return nil
		}
		dir := filepath.Dir(p)
		packages[dir] = true
		if f.Doc != nil {
			documented[dir] = true
		}
		if ast.IsGenerated(f) {
			return nil
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
				long = append(long, fset.Position(fd.Pos()).String()+" "+fd.Name.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var undocumented []string
	for dir := range packages {
		if !documented[dir] {
			undocumented = append(undocumented, dir)
		}
	}
	slices.Sort(undocumented)
	if len(undocumented) > 0 {
		t.Errorf("packages with no doc comment before their package clause: %s", strings.Join(undocumented, ", "))
	}
	if len(long) > 0 {
		t.Errorf("functions longer than %d lines:\n%s", maxFuncLines, strings.Join(long, "\n"))
	}
}
