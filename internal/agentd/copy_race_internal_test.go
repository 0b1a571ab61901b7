package agentd

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestCopySourceSwappedForASymlink: a copy for commands of another user
// resolves its source, checks that others may reach it, and reads it. A
// source swapped for a symlink in between (by a user who may write the
// directory holding it) must not lead the copy to a file in a directory
// others may not enter: the check and the read see the same file.
func TestCopySourceSwappedForASymlink(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	// The test's own temporary directories let only their owner in.
	for _, dir := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	private := filepath.Join(base, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{filepath.Join(private, "secret-dir")} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"secret.txt", "tool.sh"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte("agentd's secret\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(private, "secret.txt"), []byte("agentd's secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	shared := filepath.Join(base, "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, source, target string
		dir                  bool
	}{
		{"a file", "tool.sh", filepath.Join(private, "secret.txt"), false},
		{"a directory", "skill", filepath.Join(private, "secret-dir"), true},
		{"a directory above", "outer/tool.sh", filepath.Join(private, "secret-dir"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			f, err := newFileSystem(root, false)
			if err != nil {
				t.Fatal(err)
			}
			defer f.close()
			f.sourcesForOthers = true
			src := filepath.Join(shared, tt.name, tt.source)
			swap := src
			if tt.name == "a directory above" {
				swap = filepath.Dir(src)
			}
			if tt.dir {
				if err := os.MkdirAll(filepath.Join(src, "x"), 0o755); err != nil {
					t.Fatal(err)
				}
			} else if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
				t.Fatal(err)
			} else if err := os.WriteFile(src, []byte("echo tool\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			// Between resolving the source and reading it, the source (or
			// a directory above it) becomes a symlink into the private
			// directory.
			f.afterResolve = func() {
				if err := os.RemoveAll(swap); err != nil {
					t.Error(err)
				}
				if err := os.Symlink(tt.target, swap); err != nil {
					t.Error(err)
				}
			}
			_, err = f.copyIn(src, "copied", writeLimits{maxBytes: 1 << 20, unpackBytes: 1 << 20, unpackFiles: 100})
			if err == nil {
				b, _ := os.ReadFile(filepath.Join(root, "copied"))
				if b == nil {
					b, _ = os.ReadFile(filepath.Join(root, "copied", "secret.txt"))
				}
				t.Fatalf("the copy read through the swapped-in symlink (%q)", b)
			}
			var e *Error
			if !errors.As(err, &e) || (e.Code != CodeBadRequest && e.Code != CodePathOutsideRoot) {
				t.Fatalf("got %v; want a refusal", err)
			}
		})
	}
}

// TestCopyTreeEntrySwappedAfterListing: a tree copy for commands of
// another user checks that others may read each entry; an entry replaced,
// between the listing and the open, by a file only its owner may read
// must not be copied: the check applies to the file opened, which must
// be the one listed.
func TestCopyTreeEntrySwappedAfterListing(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	for _, dir := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	skill := filepath.Join(base, "skill")
	if err := os.Mkdir(skill, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(skill, "tool.sh"), []byte("echo tool\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(skill, ".secret")
	root := t.TempDir()
	f, err := newFileSystem(root, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	f.sourcesForOthers = true
	f.beforeEntryOpen = func(name string) {
		if name != "tool.sh" {
			return
		}
		if err := os.WriteFile(secret, []byte("agentd's secret\n"), 0o600); err != nil {
			t.Error(err)
		}
		if err := os.Rename(secret, filepath.Join(skill, "tool.sh")); err != nil {
			t.Error(err)
		}
	}
	_, err = f.copyIn(skill, "copied", writeLimits{maxBytes: 1 << 20, unpackBytes: 1 << 20, unpackFiles: 100})
	if err == nil {
		b, _ := os.ReadFile(filepath.Join(root, "copied", "tool.sh"))
		t.Fatalf("the copy read the swapped-in file (%q)", b)
	}
	var e *Error
	if !errors.As(err, &e) || (e.Code != CodeBadRequest && e.Code != CodePathOutsideRoot) {
		t.Fatalf("got %v; want a refusal", err)
	}
}
