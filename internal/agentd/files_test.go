//go:build unix

package agentd_test

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

// confinedRoot builds a root with a file, a directory, and symlinks pointing
// inside and outside, plus a secret file outside the root.
func confinedRoot(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root = filepath.Join(base, "root")
	outside = filepath.Join(base, "outside")
	for _, d := range []string{root, outside, filepath.Join(root, "dir")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		filepath.Join(root, "hello.txt"):     "hello, world",
		filepath.Join(outside, "secret.txt"): "secret",
	}
	for p, content := range files {
		if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		filepath.Join(root, "escape"):          outside,
		filepath.Join(root, "escape-file"):     filepath.Join(outside, "secret.txt"),
		filepath.Join(root, "relative-escape"): "../outside/secret.txt",
		filepath.Join(root, "dir", "inside"):   "../hello.txt",
	}
	for link, target := range links {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root, outside
}

func TestReadFile(t *testing.T) {
	t.Parallel()
	root, outside := confinedRoot(t)
	c := newClient(t, agentdtest.WithRoot(root))
	tests := []struct {
		name          string
		path          string
		offset, limit int64
		want          string
		wantErr       error
	}{
		{"whole file", "hello.txt", 0, 0, "hello, world", nil},
		{"absolute inside", filepath.Join(root, "hello.txt"), 0, 0, "hello, world", nil},
		{"range", "hello.txt", 7, 3, "wor", nil},
		{"offset past end", "hello.txt", 100, 0, "", nil},
		{"symlink inside", "dir/inside", 0, 0, "hello, world", nil},
		{"directory", "dir", 0, 0, "", agentd.ErrIsDirectory},
		{"missing", "nope.txt", 0, 0, "", agentd.ErrNotFound},
		{"dotdot", "../outside/secret.txt", 0, 0, "", agentd.ErrPathOutsideRoot},
		{"dotdot inside path", "dir/../../outside/secret.txt", 0, 0, "", agentd.ErrPathOutsideRoot},
		{"absolute outside", filepath.Join(outside, "secret.txt"), 0, 0, "", agentd.ErrPathOutsideRoot},
		{"etc passwd", "/etc/passwd", 0, 0, "", agentd.ErrPathOutsideRoot},
		{"symlinked dir out", "escape/secret.txt", 0, 0, "", agentd.ErrPathOutsideRoot},
		{"symlinked file out", "escape-file", 0, 0, "", agentd.ErrPathOutsideRoot},
		{"relative symlink out", "relative-escape", 0, 0, "", agentd.ErrPathOutsideRoot},
		{"empty path", "", 0, 0, "", agentd.ErrBadRequest},
		{"fifo", "fifo", 0, 0, "", agentd.ErrBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			data, size, err := c.ReadFile(testCtx(t), tt.path, tt.offset, tt.limit)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("got %v; want %v", err, tt.wantErr)
				}
				if strings.Contains(string(data), "secret") {
					t.Fatal("leaked the secret")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(data) != tt.want || size != int64(len("hello, world")) {
				t.Fatalf("got %q size %d", data, size)
			}
		})
	}
}

func TestStatBatch(t *testing.T) {
	t.Parallel()
	root, outside := confinedRoot(t)
	c := newClient(t, agentdtest.WithRoot(root))
	paths := []string{"hello.txt", "dir", "nope", "escape/secret.txt", filepath.Join(outside, "secret.txt"), "dir/inside", "."}
	got, err := c.Stat(testCtx(t), paths...)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(paths) {
		t.Fatalf("%d results for %d paths", len(got), len(paths))
	}
	want := []struct {
		exists  bool
		typ     string
		size    int64
		mode    string
		errCode string
	}{
		{true, "file", 12, "0640", ""},
		{true, "dir", -1, "0755", ""},
		{false, "", 0, "", ""},
		{false, "", 0, "", agentd.CodePathOutsideRoot},
		{false, "", 0, "", agentd.CodePathOutsideRoot},
		{true, "file", 12, "0640", ""},
		{true, "dir", -1, "", ""},
	}
	for i, w := range want {
		g := got[i]
		if g.Path != paths[i] || g.Exists != w.exists || g.Type != w.typ || (w.size >= 0 && g.Size != w.size) || (w.mode != "" && g.Mode != w.mode) {
			t.Errorf("%s: got %+v", paths[i], g)
		}
		if (g.Error == nil) != (w.errCode == "") || (g.Error != nil && g.Error.Code != w.errCode) {
			t.Errorf("%s: error %+v; want code %q", paths[i], g.Error, w.errCode)
		}
		if g.Exists && g.MTime == nil {
			t.Errorf("%s: no mtime", paths[i])
		}
	}
}

func TestFetch(t *testing.T) {
	t.Parallel()
	payload := bytes.Repeat([]byte("0123456789"), 1000)
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/file":
			w.Write(payload)
		case "/chunked": // no Content-Length: the limit must hold while copying
			w.(http.Flusher).Flush()
			w.Write(payload)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(src.Close)
	root, _ := confinedRoot(t)
	c := newClient(t, agentdtest.WithRoot(root))
	tests := []struct {
		name    string
		req     agentd.FetchRequest
		wantErr error
	}{
		{"download", agentd.FetchRequest{URL: src.URL + "/file", Path: "dl/../fetched.bin"}, nil},
		{"creates parents", agentd.FetchRequest{URL: src.URL + "/file", Path: "nested/deeper/f.bin"}, nil},
		{"replace existing", agentd.FetchRequest{URL: src.URL + "/file", Path: "hello.txt"}, nil},
		{"over the limit", agentd.FetchRequest{URL: src.URL + "/file", Path: "big.bin", MaxBytes: 100}, agentd.ErrTooLarge},
		{"over the limit unannounced", agentd.FetchRequest{URL: src.URL + "/chunked", Path: "big2.bin", MaxBytes: 100}, agentd.ErrTooLarge},
		{"source 404", agentd.FetchRequest{URL: src.URL + "/missing", Path: "x.bin"}, agentd.ErrFetchFailed},
		{"not http", agentd.FetchRequest{URL: "file:///etc/passwd", Path: "x.bin"}, agentd.ErrBadRequest},
		{"outside root", agentd.FetchRequest{URL: src.URL + "/file", Path: "../x.bin"}, agentd.ErrPathOutsideRoot},
		{"through symlink out", agentd.FetchRequest{URL: src.URL + "/file", Path: "escape/x.bin"}, agentd.ErrPathOutsideRoot},
		{"onto a directory", agentd.FetchRequest{URL: src.URL + "/file", Path: "dir"}, agentd.ErrIsDirectory},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, err := c.Fetch(testCtx(t), tt.req)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("got %v; want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(root, filepath.Clean(tt.req.Path)))
			if err != nil {
				t.Fatal(err)
			}
			if resp.Size != int64(len(payload)) || !bytes.Equal(got, payload) {
				t.Fatalf("size %d, content matches %v", resp.Size, bytes.Equal(got, payload))
			}
		})
	}
	t.Cleanup(func() {
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			if strings.Contains(e.Name(), ".agentd-") {
				t.Errorf("temporary file %s left behind", e.Name())
			}
		}
		if _, err := os.Stat(filepath.Join(root, "big.bin")); err == nil {
			t.Error("an over-limit download was kept")
		}
	})
}
