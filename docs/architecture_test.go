package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestArchitectureListsEveryPackage: the package table of architecture.md
// names every package directly under internal/ and no package that is
// gone, so a newcomer finds every room from it.
func TestArchitectureListsEveryPackage(t *testing.T) {
	b, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(internal/[a-z0-9_]+)`").FindAllStringSubmatch(string(b), -1) {
		documented[m[1]] = true
	}
	entries, err := os.ReadDir(filepath.Join("..", "internal"))
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	inTree := map[string]bool{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		files, _ := filepath.Glob(filepath.Join("..", "internal", e.Name(), "*.go"))
		if len(files) == 0 {
			continue
		}
		name := "internal/" + e.Name()
		inTree[name] = true
		if !documented[name] {
			missing = append(missing, name)
		}
	}
	var gone []string
	for name := range documented {
		if !inTree[name] {
			gone = append(gone, name)
		}
	}
	slices.Sort(missing)
	slices.Sort(gone)
	if len(missing) > 0 || len(gone) > 0 {
		t.Errorf("docs/architecture.md's package table lacks %s and names %s, which is not in the tree",
			strings.Join(missing, ", "), strings.Join(gone, ", "))
	}
}
