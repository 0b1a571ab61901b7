//go:build unix

package agentd_test

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// leftovers lists the staging names (".agentd-") anywhere below dir.
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	var found []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), ".agentd-") {
			found = append(found, p)
		}
		return nil
	})
	return found
}

func TestWriteFile(t *testing.T) {
	t.Parallel()
	root, outside := confinedRoot(t)
	c := newClient(t, agentdtest.WithRoot(root), agentdtest.WithConfig(func(c *agentd.Config) { c.WriteMaxBytes = 1000 }))
	tests := []struct {
		name     string
		path     string
		mode     os.FileMode
		body     string
		wantErr  error
		wantMode os.FileMode
		wantIn   string // message fragment of the error
		chunked  bool   // size not announced
	}{
		{name: "new file", path: "new.txt", body: "hello", wantMode: 0o644},
		{name: "nested with mode", path: "a/b/run.sh", mode: 0o750, body: "#!/bin/sh\n", wantMode: 0o750},
		{name: "absolute inside", path: filepath.Join(root, "abs.txt"), body: "x", wantMode: 0o644},
		{name: "replace existing", path: "hello.txt", body: "replaced", wantMode: 0o644},
		{name: "replace a symlink inside, not its target", path: "dir/inside", body: "link replaced", wantMode: 0o644},
		{name: "empty body", path: "empty.txt", body: "", wantMode: 0o644},
		{name: "dotdot", path: "../outside/x.txt", body: "x", wantErr: agentd.ErrPathOutsideRoot, wantIn: "outside the root"},
		{name: "dotdot inside path", path: "dir/../../x.txt", body: "x", wantErr: agentd.ErrPathOutsideRoot},
		{name: "absolute outside", path: filepath.Join(outside, "x.txt"), body: "x", wantErr: agentd.ErrPathOutsideRoot},
		{name: "through a symlink leaving the root", path: "escape/x.txt", body: "x", wantErr: agentd.ErrPathOutsideRoot},
		{name: "directory", path: "dir", body: "x", wantErr: agentd.ErrIsDirectory},
		{name: "root itself", path: ".", body: "x", wantErr: agentd.ErrBadRequest},
		{name: "empty path", path: "", body: "x", wantErr: agentd.ErrBadRequest},
		{name: "over the cap", path: "big.bin", body: strings.Repeat("x", 1001), wantErr: agentd.ErrTooLarge, wantIn: "limit of 1000"},
		{name: "over the cap unannounced", path: "big.bin", body: strings.Repeat("x", 1001), wantErr: agentd.ErrTooLarge, wantIn: "limit of 1000", chunked: true},
		{name: "unannounced", path: "chunked.txt", body: "chunked body", wantMode: 0o644, chunked: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			size := int64(len(tt.body))
			var body io.Reader = strings.NewReader(tt.body)
			if tt.chunked {
				size, body = -1, io.MultiReader(body) // hides the length
			}
			resp, err := c.WriteFile(testCtx(t), tt.path, tt.mode, body, size)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantIn) {
					t.Fatalf("got %v; want %v mentioning %q", err, tt.wantErr, tt.wantIn)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			full := tt.path
			if !filepath.IsAbs(full) {
				full = filepath.Join(root, full)
			}
			fi, err := os.Lstat(full)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(full)
			if string(got) != tt.body || fi.Mode() != tt.wantMode || resp.Size != int64(len(tt.body)) || resp.SHA256 != sha([]byte(tt.body)) {
				t.Fatalf("file %q mode %v, answer %+v", got, fi.Mode(), resp)
			}
		})
	}
	t.Cleanup(func() {
		if b, _ := os.ReadFile(filepath.Join(outside, "secret.txt")); string(b) != "secret" {
			t.Error("the file outside the root changed")
		}
		if entries, _ := os.ReadDir(outside); len(entries) != 1 {
			t.Errorf("something was written outside the root: %v", entries)
		}
		if _, err := os.Stat(filepath.Join(root, "big.bin")); err == nil {
			t.Error("an over-cap body was kept")
		}
		if l := leftovers(t, root); len(l) > 0 {
			t.Errorf("staging files left: %v", l)
		}
	})
}

func TestWriteFileBadMode(t *testing.T) {
	t.Parallel()
	url, token := agentdtest.Start(t, agentdtest.WithRoot(t.TempDir()))
	for _, mode := range []string{"4755", "999", "rw", "-1"} {
		req, _ := http.NewRequest(http.MethodPut, url+"/v1/files?path=x&mode="+mode, strings.NewReader("x"))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "permission bits") {
			t.Errorf("mode %s: %d %s", mode, resp.StatusCode, body)
		}
	}
}

// TestWriteFileCutBody sends half of an announced body and hangs up: the
// file never appears under its name and no staging file stays.
func TestWriteFileCutBody(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	base, token := agentdtest.Start(t, agentdtest.WithRoot(root))
	u, _ := url.Parse(base)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT /v1/files?path=cut.bin HTTP/1.1\r\nHost: agentd\r\nAuthorization: Bearer %s\r\nContent-Length: 100000\r\n\r\n", token)
	conn.Write(bytes.Repeat([]byte("y"), 50000))
	// Hang up the sending side only, so agentd's answer can still be read.
	conn.(*net.TCPConn).CloseWrite()
	answer, _ := io.ReadAll(conn)
	if !bytes.Contains(answer, []byte(" 400 ")) || !bytes.Contains(answer, []byte("before it was complete")) {
		t.Fatalf("answer to a cut body: %q", answer)
	}
	c := agentd.NewClient(base, token, nil)
	if _, err := c.WriteFile(testCtx(t), "after.txt", 0, strings.NewReader("ok"), 2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "cut.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the cut upload appeared under its name: %v", err)
	}
	if l := leftovers(t, root); len(l) > 0 {
		t.Fatalf("staging files left: %v", l)
	}
}

// entry is one member of a test archive.
type entry struct {
	name, body, link string
	typ              byte // tar type flag
	mode             int64
}

func tarGz(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.body))}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

func zipOf(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range entries {
		h := &zip.FileHeader{Name: e.name, Method: zip.Deflate}
		mode := os.FileMode(e.mode)
		if mode == 0 {
			mode = 0o644
		}
		body := e.body
		switch e.typ {
		case tar.TypeDir:
			mode |= os.ModeDir
		case tar.TypeSymlink:
			mode |= os.ModeSymlink
			body = e.link
		}
		h.SetMode(mode)
		w, err := zw.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, body)
	}
	zw.Close()
	return buf.Bytes()
}

func TestWriteArchive(t *testing.T) {
	t.Parallel()
	root, outside := confinedRoot(t)
	c := newClient(t, agentdtest.WithRoot(root), agentdtest.WithConfig(func(c *agentd.Config) {
		c.UnpackMaxBytes = 1 << 20
		c.UnpackMaxFiles = 20
	}))
	good := []entry{
		{name: "./", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/tool", body: "#!/bin/sh\necho tool\n", mode: 0o755},
		{name: "README.md", body: "# skill\n"},
		{name: "docs/guide.md", body: "guide"}, // parent not listed
		{name: "latest", typ: tar.TypeSymlink, link: "bin/tool"},
		{name: "docs/up", typ: tar.TypeSymlink, link: "../README.md"},
		{name: "ro/", typ: tar.TypeDir, mode: 0o555},
		{name: "ro/file", body: "in a read-only dir", mode: 0o444},
	}
	tooMany := make([]entry, 21)
	for i := range tooMany {
		tooMany[i] = entry{name: fmt.Sprintf("f%d", i), body: "x"}
	}
	// The archive's own top directory, named again and again, costs
	// reading like any entry and counts like one.
	tooManyTops := make([]entry, 21)
	for i := range tooManyTops {
		tooManyTops[i] = entry{name: "./", typ: tar.TypeDir, mode: 0o755}
	}
	bomb := entry{name: "zeros", body: strings.Repeat("\x00", 2<<20)}
	tests := []struct {
		name    string
		entries []entry
		wantErr error
		wantIn  string
	}{
		{"good", good, nil, ""},
		{"dotdot", []entry{{name: "../evil", body: "x"}}, agentd.ErrPathOutsideRoot, `".."`},
		{"dotdot inside", []entry{{name: "a/../../evil", body: "x"}}, agentd.ErrPathOutsideRoot, ""},
		{"absolute", []entry{{name: "/tmp/evil", body: "x"}}, agentd.ErrPathOutsideRoot, "absolute"},
		{"symlink out", []entry{{name: "l", typ: tar.TypeSymlink, link: "../../outside"}}, agentd.ErrPathOutsideRoot, "points outside"},
		{"symlink absolute", []entry{{name: "l", typ: tar.TypeSymlink, link: outside}}, agentd.ErrPathOutsideRoot, "absolute"},
		{"write through a symlink", []entry{{name: "l", typ: tar.TypeSymlink, link: "."}, {name: "l/../../evil", body: "x"}}, agentd.ErrPathOutsideRoot, ""},
		// Each target stays inside when read as text, but "deep/up" is the
		// top of the tree, so a link below it (or one naming a path through
		// it) resolves above the tree.
		{"symlink below a symlink to the top", []entry{{name: "deep/up", typ: tar.TypeSymlink, link: ".."}, {name: "deep/up/l", typ: tar.TypeSymlink, link: "../../outside"}}, agentd.ErrPathOutsideRoot, "leads outside"},
		{"symlink through a symlink to the top", []entry{{name: "deep/up", typ: tar.TypeSymlink, link: ".."}, {name: "y", typ: tar.TypeSymlink, link: "deep/up"}, {name: "t", typ: tar.TypeSymlink, link: "y/.."}}, agentd.ErrPathOutsideRoot, "leads outside"},
		{"duplicate", []entry{{name: "a", body: "1"}, {name: "a", body: "2"}}, agentd.ErrBadRequest, "twice"},
		{"backslash", []entry{{name: `a\..\..\evil`, body: "x"}}, agentd.ErrBadRequest, "backslash"},
		{"too many entries", tooMany, agentd.ErrTooLarge, "more than 20 entries"},
		{"too many top directories", tooManyTops, agentd.ErrTooLarge, "more than 20 entries"},
		{"bomb", []entry{bomb}, agentd.ErrTooLarge, "more than 1048576 bytes"},
		// A file named as the top directory was skipped, its body
		// decompressed uncounted: a bomb the limit never saw.
		{"a file named as the top directory", []entry{{name: ".", body: bomb.body}}, agentd.ErrBadRequest, "top directory"},
	}
	tarOnly := []struct {
		name    string
		entries []entry
		wantErr error
		wantIn  string
	}{
		{"hard link out", []entry{{name: "h", typ: tar.TypeLink, link: "../outside/secret.txt"}}, agentd.ErrPathOutsideRoot, ""},
		{"device", []entry{{name: "dev", typ: tar.TypeChar}}, agentd.ErrBadRequest, "device"},
		{"fifo", []entry{{name: "p", typ: tar.TypeFifo}}, agentd.ErrBadRequest, "pipe"},
		{"hard link to a later entry", []entry{{name: "h", typ: tar.TypeLink, link: "later"}, {name: "later", body: "x"}}, agentd.ErrBadRequest, "not earlier"},
		{"hard link to a symlink", []entry{{name: "a/l", typ: tar.TypeSymlink, link: "../x"}, {name: "h", typ: tar.TypeLink, link: "a/l"}}, agentd.ErrBadRequest, "symbolic link"},
	}
	for _, format := range []string{agentd.ArchiveTarGz, agentd.ArchiveZip} {
		cases := tests
		if format == agentd.ArchiveTarGz {
			cases = append(cases, tarOnly...)
		}
		for _, tt := range cases {
			t.Run(format+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				var data []byte
				if format == agentd.ArchiveZip {
					data = zipOf(t, tt.entries...)
				} else {
					data = tarGz(t, tt.entries...)
				}
				dir := "skills/" + format + "-" + strings.ReplaceAll(tt.name, " ", "-")
				// A directory already there is kept when the archive is
				// refused and replaced when it is taken.
				if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
					t.Fatal(err)
				}
				os.WriteFile(filepath.Join(root, dir, "old.txt"), []byte("old"), 0o644)
				resp, err := c.WriteArchive(testCtx(t), dir, format, bytes.NewReader(data), int64(len(data)))
				if tt.wantErr != nil {
					if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantIn) {
						t.Fatalf("got %v; want %v mentioning %q", err, tt.wantErr, tt.wantIn)
					}
					if b, _ := os.ReadFile(filepath.Join(root, dir, "old.txt")); string(b) != "old" {
						t.Fatal("a refused archive changed the directory")
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if resp.SHA256 != sha(data) || resp.Size != int64(len(data)) || resp.Files != len(good)-1 {
					t.Fatalf("answer %+v", resp)
				}
				full := filepath.Join(root, dir)
				if _, err := os.Stat(filepath.Join(full, "old.txt")); !errors.Is(err, os.ErrNotExist) {
					t.Fatal("the replaced directory's old file is still there")
				}
				checks := map[string]string{"bin/tool": "#!/bin/sh\necho tool\n", "latest": "#!/bin/sh\necho tool\n", "docs/up": "# skill\n", "docs/guide.md": "guide", "ro/file": "in a read-only dir"}
				for p, want := range checks {
					if b, err := os.ReadFile(filepath.Join(full, p)); err != nil || string(b) != want {
						t.Errorf("%s: %q %v", p, b, err)
					}
				}
				if fi, _ := os.Stat(filepath.Join(full, "bin/tool")); fi == nil || fi.Mode().Perm() != 0o755 {
					t.Errorf("bin/tool mode %v", fi)
				}
				if fi, _ := os.Stat(filepath.Join(full, "ro")); fi == nil || fi.Mode().Perm() != 0o555 {
					t.Errorf("ro mode %v", fi)
				}
				os.Chmod(filepath.Join(full, "ro"), 0o755) // so the test's cleanup can remove it
			})
		}
	}
	t.Cleanup(func() {
		if entries, _ := os.ReadDir(outside); len(entries) != 1 {
			t.Errorf("something was written outside the root: %v", entries)
		}
		if _, err := os.Stat("/tmp/evil"); err == nil {
			t.Error("an absolute entry was written")
		}
		if l := leftovers(t, root); len(l) > 0 {
			t.Errorf("staging left: %v", l)
		}
	})
}

func TestWriteArchiveRefusals(t *testing.T) {
	t.Parallel()
	root, _ := confinedRoot(t)
	c := newClient(t, agentdtest.WithRoot(root), agentdtest.WithConfig(func(c *agentd.Config) { c.WriteMaxBytes = 200 }))
	data := tarGz(t, entry{name: "a", body: "x"})
	tests := []struct {
		name, dir, format string
		body              []byte
		wantErr           error
		wantIn            string
	}{
		{"unknown format", "d", "rar", data, agentd.ErrBadRequest, `"tar.gz" or "zip"`},
		{"not gzip", "d", agentd.ArchiveTarGz, []byte("plain text"), agentd.ErrBadRequest, "gzip"},
		{"not zip", "d", agentd.ArchiveZip, []byte("plain text"), agentd.ErrBadRequest, "zip"},
		{"onto a file", "hello.txt", agentd.ArchiveTarGz, data, agentd.ErrBadRequest, "not a directory"},
		{"outside", "../x", agentd.ArchiveTarGz, data, agentd.ErrPathOutsideRoot, ""},
		{"through a symlink", "escape/x", agentd.ArchiveTarGz, data, agentd.ErrPathOutsideRoot, ""},
		{"the root", ".", agentd.ArchiveTarGz, data, agentd.ErrBadRequest, "root directory"},
		{"over the cap", "d", agentd.ArchiveTarGz, bytes.Repeat([]byte("z"), 201), agentd.ErrTooLarge, "limit of 200"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := c.WriteArchive(testCtx(t), tt.dir, tt.format, bytes.NewReader(tt.body), int64(len(tt.body)))
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantIn) {
				t.Fatalf("got %v; want %v mentioning %q", err, tt.wantErr, tt.wantIn)
			}
		})
	}
	if b, _ := os.ReadFile(filepath.Join(root, "hello.txt")); string(b) != "hello, world" {
		t.Fatal("a refused archive replaced a file")
	}
}

func TestFetchUnpackAndPin(t *testing.T) {
	t.Parallel()
	archive := tarGz(t, entry{name: "skill/SKILL.md", body: "# s"}, entry{name: "skill/run", body: "echo", mode: 0o755})
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(archive)
	}))
	t.Cleanup(src.Close)
	root := t.TempDir()
	c := newClient(t, agentdtest.WithRoot(root))
	ctx := testCtx(t)

	resp, err := c.Fetch(ctx, agentd.FetchRequest{URL: src.URL, Path: "skills/s", Unpack: agentd.ArchiveTarGz, SHA256: strings.ToUpper(sha(archive))})
	if err != nil {
		t.Fatal(err)
	}
	if resp.SHA256 != sha(archive) || resp.Files != 2 || resp.Size != int64(len(archive)) {
		t.Fatalf("answer %+v", resp)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "skills/s/skill/SKILL.md")); string(b) != "# s" {
		t.Fatalf("unpacked %q", b)
	}

	wrong := strings.Repeat("ab", 32)
	for _, req := range []agentd.FetchRequest{
		{URL: src.URL, Path: "pinned/dir", Unpack: agentd.ArchiveTarGz, SHA256: wrong},
		{URL: src.URL, Path: "pinned/file.tgz", SHA256: wrong},
	} {
		_, err := c.Fetch(ctx, req)
		if !errors.Is(err, agentd.ErrChecksumMismatch) || !strings.Contains(err.Error(), wrong) || !strings.Contains(err.Error(), sha(archive)) {
			t.Fatalf("%s: got %v; want checksum_mismatch naming both hashes", req.Path, err)
		}
		var ae *agentd.Error
		if errors.As(err, &ae) && ae.Status != http.StatusUnprocessableEntity {
			t.Fatalf("status %d", ae.Status)
		}
		if _, err := os.Lstat(filepath.Join(root, req.Path)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: something was left after a mismatch", req.Path)
		}
	}
	if l := leftovers(t, root); len(l) > 0 {
		t.Fatalf("staging left: %v", l)
	}

	for _, req := range []agentd.FetchRequest{
		{URL: src.URL, Path: "x", SHA256: "not-hex"},
		{URL: src.URL, Path: "x", Unpack: "rar"},
	} {
		if _, err := c.Fetch(ctx, req); !errors.Is(err, agentd.ErrBadRequest) {
			t.Fatalf("%+v: got %v", req, err)
		}
	}
}

func TestCopy(t *testing.T) {
	t.Parallel()
	root, outside := confinedRoot(t)
	src := filepath.Join(t.TempDir(), "skills", "tools")
	for p, body := range map[string]string{"SKILL.md": "# tools", "bin/run": "#!/bin/sh\n", "empty/.keep": ""} {
		os.MkdirAll(filepath.Dir(filepath.Join(src, p)), 0o755)
		os.WriteFile(filepath.Join(src, p), []byte(body), 0o644)
	}
	os.Chmod(filepath.Join(src, "bin/run"), 0o755)
	os.Symlink("bin/run", filepath.Join(src, "run"))
	bad := filepath.Join(t.TempDir(), "bad")
	os.MkdirAll(bad, 0o755)
	os.Symlink(outside, filepath.Join(bad, "out"))
	c := newClient(t, agentdtest.WithRoot(root))
	ctx := testCtx(t)

	// Build the documented tree hash by hand.
	lines := []string{
		"SKILL.md\x00file\x00" + sha([]byte("# tools")),
		"bin\x00dir\x00",
		"bin/run\x00file\x00" + sha([]byte("#!/bin/sh\n")),
		"empty\x00dir\x00",
		"empty/.keep\x00file\x00" + sha(nil),
		"run\x00symlink\x00bin/run",
	}
	wantHash := sha([]byte(strings.Join(lines, "\n") + "\n"))

	resp, err := c.Copy(ctx, src, "ws/.skills/tools")
	if err != nil {
		t.Fatal(err)
	}
	if resp.SHA256 != wantHash || resp.Files != 6 || resp.Size != int64(len("# tools")+len("#!/bin/sh\n")) {
		t.Fatalf("answer %+v; want hash %s", resp, wantHash)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "ws/.skills/tools/run")); string(b) != "#!/bin/sh\n" {
		t.Fatalf("copied link reads %q", b)
	}
	if fi, _ := os.Stat(filepath.Join(root, "ws/.skills/tools/bin/run")); fi == nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode not kept: %v", fi)
	}
	// Copying again gives the same hash and replaces the tree.
	os.WriteFile(filepath.Join(root, "ws/.skills/tools/stray"), []byte("x"), 0o644)
	again, err := c.Copy(ctx, src, "ws/.skills/tools")
	if err != nil || again.SHA256 != wantHash {
		t.Fatalf("second copy %+v %v", again, err)
	}
	if _, err := os.Stat(filepath.Join(root, "ws/.skills/tools/stray")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the replaced tree kept a stray file")
	}

	one, err := c.Copy(ctx, filepath.Join(src, "SKILL.md"), "ws/one.md")
	if err != nil || one.SHA256 != sha([]byte("# tools")) || one.Files != 1 {
		t.Fatalf("file copy %+v %v", one, err)
	}

	tests := []struct {
		name, from, to string
		wantErr        error
		wantIn         string
	}{
		{"relative from", "skills/tools", "x", agentd.ErrBadRequest, "absolute"},
		{"missing from", filepath.Join(src, "nope"), "x", agentd.ErrNotFound, "does not exist"},
		{"to outside", src, "../x", agentd.ErrPathOutsideRoot, ""},
		{"to through a symlink", src, "escape/x", agentd.ErrPathOutsideRoot, ""},
		{"symlink leaving the tree", bad, "bad", agentd.ErrPathOutsideRoot, "points"},
		{"into itself", root, "dir/self", agentd.ErrBadRequest, "inside the source"},
		{"a file onto a directory", filepath.Join(src, "SKILL.md"), "dir", agentd.ErrIsDirectory, ""},
		{"agentd's own process files", "/proc/self/environ", "x", agentd.ErrPathOutsideRoot, "which agentd does not copy from"},
		{"/proc through a symlink", "/proc/self/root/proc/self/environ", "x", agentd.ErrPathOutsideRoot, "which agentd does not copy from"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Copy(ctx, tt.from, tt.to)
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantIn) {
				t.Fatalf("got %v; want %v mentioning %q", err, tt.wantErr, tt.wantIn)
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(root, "bad")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a refused copy left its destination")
	}
	if l := leftovers(t, root); len(l) > 0 {
		t.Fatalf("staging left: %v", l)
	}
}

func TestRekey(t *testing.T) {
	t.Parallel()
	base, template := agentdtest.Start(t)
	old := agentd.NewClient(base, template, nil)
	ctx := testCtx(t)
	if err := old.Rekey(ctx, "short"); !errors.Is(err, agentd.ErrBadRequest) || !strings.Contains(err.Error(), "at least 32") {
		t.Fatalf("short token: %v", err)
	}
	long := strings.Repeat("t", 40)
	longURL, _ := agentdtest.Start(t, agentdtest.WithConfig(func(c *agentd.Config) { c.Token = long }))
	if err := agentd.NewClient(longURL, long, nil).Rekey(ctx, long); !errors.Is(err, agentd.ErrBadRequest) || !strings.Contains(err.Error(), "differ") {
		t.Fatalf("rekey to the same token: %v", err)
	}
	// An agentd that already served someone else holding the template's
	// token (a command started, a file planted) is not rekeyed: the
	// console then kills the sandbox rather than trust it.
	usedURL, _ := agentdtest.Start(t, agentdtest.WithConfig(func(c *agentd.Config) { c.Token = template }))
	used := agentd.NewClient(usedURL, template, nil)
	if _, err := used.Stat(ctx, "."); err != nil {
		t.Fatal(err)
	}
	if err := used.Rekey(ctx, strings.Repeat("u", 40)); !errors.Is(err, agentd.ErrUsedBeforeRekey) {
		t.Fatalf("rekey after another request: %v", err)
	}
	if _, err := used.Stat(ctx, "."); err != nil {
		t.Fatalf("the refused rekey changed the token: %v", err)
	}
	perSandbox := strings.Repeat("k", 40)
	if err := old.Rekey(ctx, perSandbox); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Stat(ctx, "."); !errors.Is(err, agentd.ErrUnauthorized) {
		t.Fatalf("the template token after rekey: %v", err)
	}
	if err := old.Rekey(ctx, strings.Repeat("m", 40)); !errors.Is(err, agentd.ErrUnauthorized) {
		t.Fatalf("rekey with the old token: %v", err)
	}
	fresh := agentd.NewClient(base, perSandbox, nil)
	if _, err := fresh.Stat(ctx, "."); err != nil {
		t.Fatalf("the new token: %v", err)
	}
	if err := fresh.Rekey(ctx, strings.Repeat("n", 40)); !errors.Is(err, agentd.ErrAlreadyRekeyed) {
		t.Fatalf("second rekey: %v", err)
	}
	if _, err := fresh.Stat(ctx, "."); err != nil {
		t.Fatalf("the new token after a refused second rekey: %v", err)
	}
}

// TestCopyForOtherUser: with commands run as another user, a copy takes
// from outside the root only what that user could read itself.
func TestCopyForOtherUser(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	// t.TempDir's directories are 0700: open them like a shared mount.
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(p string, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
	}
	mk(filepath.Join(base, "open/SKILL.md"), 0o644)
	mk(filepath.Join(base, "secretive/SKILL.md"), 0o644)
	mk(filepath.Join(base, "secretive/private.key"), 0o600)
	mk(filepath.Join(base, "closed/inner/SKILL.md"), 0o644)
	os.Chmod(filepath.Join(base, "closed"), 0o700)
	mk(filepath.Join(base, "group-only.txt"), 0o640)
	c := newClient(t, agentdtest.WithRoot(t.TempDir()), agentdtest.WithConfig(func(c *agentd.Config) {
		c.RunAs = &agentd.Credential{UID: 65534, GID: 65534}
	}))
	ctx := testCtx(t)
	if _, err := c.Copy(ctx, filepath.Join(base, "open"), "open"); err != nil {
		t.Fatalf("a tree others may read: %v", err)
	}
	for _, tc := range []struct{ name, from, wantIn string }{
		{"a file only its owner reads", filepath.Join(base, "secretive"), "not readable by others"},
		{"below a directory others may not enter", filepath.Join(base, "closed/inner"), "others may not enter"},
		{"a single file others may not read", filepath.Join(base, "group-only.txt"), "not readable by others"},
	} {
		if _, err := c.Copy(ctx, tc.from, "x"); !errors.Is(err, agentd.ErrPathOutsideRoot) || !strings.Contains(err.Error(), tc.wantIn) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// TestWritesNeedARootWithRunAs: agentd running commands as another user
// (it is root) without --root refuses every write and every read of a
// file's bytes, which would otherwise be root's, anywhere: a session
// member uploading to /etc or reading /etc/shadow.
func TestWritesNeedARootWithRunAs(t *testing.T) {
	t.Parallel()
	outside := t.TempDir()
	// The test's own temporary directories let only their owner in; the
	// copy's source must be one others may read.
	for _, dir := range []string{filepath.Dir(outside), outside} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	src := filepath.Join(outside, "skill.md")
	if err := os.WriteFile(src, []byte("# skill"), 0o644); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(outside, "private.key")
	if err := os.WriteFile(private, []byte("root's secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, agentdtest.WithConfig(func(c *agentd.Config) {
		c.RunAs = &agentd.Credential{UID: 65534, GID: 65534}
	}))
	ctx := testCtx(t)
	archive := tarGz(t, entry{name: "a", body: "x"})
	tests := []struct {
		name string
		call func(dst string) error
	}{
		{"PUT /v1/files", func(dst string) error {
			_, err := c.WriteFile(ctx, dst, 0, strings.NewReader("evil"), 4)
			return err
		}},
		{"PUT /v1/files/archive", func(dst string) error {
			_, err := c.WriteArchive(ctx, dst, agentd.ArchiveTarGz, bytes.NewReader(archive), int64(len(archive)))
			return err
		}},
		{"POST /v1/files/copy", func(dst string) error {
			_, err := c.Copy(ctx, src, dst)
			return err
		}},
		{"GET /v1/files", func(string) error {
			_, _, err := c.ReadFile(ctx, private, 0, 0)
			return err
		}},
		{"POST /v1/files/fetch", func(dst string) error {
			// Refused before anything is requested.
			_, err := c.Fetch(ctx, agentd.FetchRequest{URL: "http://127.0.0.1:1/skill.md", Path: dst})
			return err
		}},
	}
	for _, tt := range tests {
		dst := filepath.Join(outside, "written-"+strings.NewReplacer("/", "-", " ", "").Replace(tt.name))
		err := tt.call(dst)
		if !errors.Is(err, agentd.ErrPathOutsideRoot) || !strings.Contains(err.Error(), "--root") {
			t.Errorf("%s: got %v; want a refusal naming --root", tt.name, err)
		}
		if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %s was written", tt.name, dst)
		}
	}
}
