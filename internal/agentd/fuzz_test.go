//go:build unix

package agentd_test

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// fuzzServer is a server whose "shell" ignores the command (so fuzzed
// commands never run) and whose downloads always fail (so fuzzed URLs are
// never contacted). It holds one long-lived TTY session for stdin and resize.
type fuzzServer struct {
	srv     *agentd.Server
	handler http.Handler
	token   string
	keepID  string
	// dir holds the root and the fake shell; nothing else may appear.
	dir string
}

func newFuzzServer(f *testing.F) *fuzzServer {
	f.Helper()
	dir := f.TempDir()
	shell := filepath.Join(dir, "fakesh")
	script := "#!/bin/sh\ncase \"$2\" in keep) exec cat >/dev/null;; esac\nexit 0\n"
	if err := os.WriteFile(shell, []byte(script), 0o755); err != nil {
		f.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(filepath.Join(root, "sub"), 0o755); err != nil {
		f.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "file.txt"), []byte("content"), 0o644)
	srv, err := agentd.NewServer(agentd.Config{
		Token:       "fuzz-token-0123456789",
		Root:        root,
		Shell:       shell,
		MaxSessions: 32,
		KillGrace:   50 * time.Millisecond,
		FetchClient: &http.Client{Transport: roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, errors.New("no network while fuzzing")
		})},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { srv.Close() })
	fs := &fuzzServer{srv: srv, handler: srv.Handler(), token: "fuzz-token-0123456789", dir: dir}
	rec := fs.serve(http.MethodPost, "/v1/sessions", "", []byte(`{"command":"keep","tty":true}`), time.Second)
	var resp agentd.SessionResponse
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || resp.SessionID == "" {
		f.Fatalf("keep session: %d %s", rec.Code, rec.Body)
	}
	fs.keepID = resp.SessionID
	return fs
}

// serve sends one request straight to the handler. The short deadline ends
// any long-poll or wait a fuzzed request asks for.
func (fs *fuzzServer) serve(method, path, rawQuery string, body []byte, deadline time.Duration) *httptest.ResponseRecorder {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	req := (&http.Request{
		Method:        method,
		URL:           &url.URL{Path: path, RawQuery: rawQuery},
		Header:        http.Header{"Authorization": {"Bearer " + fs.token}},
		Body:          http.NoBody,
		ContentLength: int64(len(body)),
		Host:          "agentd",
		RequestURI:    path,
	}).WithContext(ctx)
	if len(body) > 0 {
		req.Body = nopCloser{bytes.NewReader(body)}
	}
	rec := httptest.NewRecorder()
	fs.handler.ServeHTTP(rec, req)
	return rec
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

// checkResponse fails on a 500 (which is also what a recovered panic
// becomes) and on error responses that are not the JSON envelope.
func checkResponse(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code == http.StatusInternalServerError {
		t.Fatalf("500: %s", rec.Body)
	}
	if rec.Code >= 400 {
		var env agentd.ErrorEnvelope
		if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error.Code == "" {
			t.Fatalf("%d without an error envelope: %q", rec.Code, rec.Body)
		}
	}
}

// FuzzJSONEndpoints sends arbitrary bodies to every JSON endpoint.
func FuzzJSONEndpoints(f *testing.F) {
	fs := newFuzzServer(f)
	seeds := []struct {
		endpoint uint8
		body     string
	}{
		{0, `{"command":"echo hi","wait_ms":100}`},
		{0, `{"command":"x","cwd":"sub","env":{"A":"b"},"tty":true,"rows":10,"cols":20,"timeout_ms":5}`},
		{0, `{"command":"x","cwd":"../..","stdin":true,"overflow":"block"}`},
		{0, `{"command":"x","env":{"":"x"}}`},
		{0, `{"command":"x","rows":-1}`},
		{0, `{"command":"x"}{"command":"y"}`},
		{0, `{"command":"x","wait_ms":1e99}`},
		{0, `{"command":"","timeout_ms":9223372036854775807}`},
		{0, "\xff\xfe{"},
		{0, `[]`},
		{0, `null`},
		{1, `{"text":"hello\n"}`},
		{1, `{"data":"AwQ=","eof":true}`},
		{1, `{"data":"not base64"}`},
		{1, `{"data":"eA==","text":"x"}`},
		{2, `{"rows":40,"cols":120}`},
		{2, `{"rows":0,"cols":1}`},
		{2, `{"rows":65536}`},
		{3, `{"paths":["file.txt","sub","/etc/passwd","../x","sub/../../x","\u0000",""]}`},
		{3, `{"paths":null}`},
		{3, `{"paths":[1]}`},
		{4, `{"url":"http://example.com/x","path":"dl.bin","max_bytes":10}`},
		{4, `{"url":"ftp://x","path":"a"}`},
		{4, `{"url":"http://x","path":"../../etc/x"}`},
		{4, `{"url":"http://x","path":"sub"}`},
		{4, `{"url":"http://x","path":"a","timeout_ms":-1,"max_bytes":99999999999999}`},
		{4, `{"url":"http://x","path":"d","unpack":"zip","sha256":"00"}`},
		{4, `{"url":"http://x","path":"d","unpack":"rar","sha256":"` + strings.Repeat("a", 64) + `"}`},
		{5, `{"rows":1,"cols":1}`},
	}
	for _, s := range seeds {
		f.Add(s.endpoint, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, endpoint uint8, body []byte) {
		paths := []string{
			"/v1/sessions",
			"/v1/sessions/" + fs.keepID + "/stdin",
			"/v1/sessions/" + fs.keepID + "/resize",
			"/v1/files/stat",
			"/v1/files/fetch",
			"/v1/sessions/unknown/resize",
		}
		rec := fs.serve(http.MethodPost, paths[int(endpoint)%len(paths)], "", body, 50*time.Millisecond)
		checkResponse(t, rec)
	})
}

// FuzzQueryEndpoints sends arbitrary methods, paths and query strings.
func FuzzQueryEndpoints(f *testing.F) {
	fs := newFuzzServer(f)
	seeds := []struct{ method, path, query string }{
		{"GET", "/v1/sessions/" + fs.keepID, "cursor=0&wait_ms=10"},
		{"GET", "/v1/sessions/" + fs.keepID, "cursor=18446744073709551615"},
		{"GET", "/v1/sessions/" + fs.keepID, "cursor=-1&wait_ms=x"},
		{"GET", "/v1/sessions/" + fs.keepID, "wait_ms=99999999999999999999"},
		{"GET", "/v1/sessions/%2e%2e", ""},
		{"DELETE", "/v1/sessions/nope", ""},
		{"GET", "/v1/files", "path=file.txt&offset=2&limit=3"},
		{"GET", "/v1/files", "path=sub"},
		{"GET", "/v1/files", "path=../../../etc/passwd"},
		{"GET", "/v1/files", "path=/etc/passwd&offset=99999999999999999999"},
		{"GET", "/v1/files", "path=%00&limit=-1"},
		{"GET", "/v1/files", "path=file.txt&offset=9223372036854775807&limit=1"},
		{"GET", "/healthz", ""},
		{"BREW", "/v1/sessions", ""},
		{"GET", "//v1//files", "path=;"},
	}
	for _, s := range seeds {
		f.Add(s.method, s.path, s.query)
	}
	f.Fuzz(func(t *testing.T, method, path, query string) {
		if method == "" || !validMethod(method) {
			method = http.MethodGet
		}
		if path == "" || path[0] != '/' {
			path = "/" + path
		}
		rec := fs.serve(method, path, query, nil, 50*time.Millisecond)
		checkResponse(t, rec)
	})
}

// validMethod reports whether m is an HTTP token, as net/http requires.
func validMethod(m string) bool {
	for _, c := range []byte(m) {
		if c <= ' ' || c >= 0x7f || bytes.IndexByte([]byte(`()<>@,;:\"/[]?={}`), c) >= 0 {
			return false
		}
	}
	return true
}

// FuzzArchiveEntries unpacks archives with arbitrary entry names, types
// and link targets: nothing may land outside the target directory's root,
// and every refusal is a 4xx with the error envelope.
func FuzzArchiveEntries(f *testing.F) {
	fs := newFuzzServer(f)
	outside := fs.dir
	seeds := []struct {
		name, link string
		typ        byte
		zip        bool
	}{
		{"a.txt", "", tar.TypeReg, false},
		{"../evil", "", tar.TypeReg, false},
		{"/abs/evil", "", tar.TypeReg, true},
		{"a/../../evil", "", tar.TypeReg, false},
		{"l", "../../evil", tar.TypeSymlink, false},
		{"l", "/etc", tar.TypeSymlink, true},
		{"h", "../file.txt", tar.TypeLink, false},
		{"dev", "", tar.TypeChar, false},
		{"./", "", tar.TypeDir, false},
		{"a\\..\\evil", "", tar.TypeReg, true},
		{"a\x00b", "", tar.TypeReg, false},
	}
	for _, s := range seeds {
		f.Add(s.name, s.link, s.typ, s.zip, "second")
	}
	f.Fuzz(func(t *testing.T, name, link string, typ byte, isZip bool, second string) {
		entries := []entry{{name: name, link: link, typ: typ, body: "x"}, {name: second, body: "y"}}
		var body []byte
		format := agentd.ArchiveTarGz
		if isZip {
			format = agentd.ArchiveZip
			body = zipOfLoose(entries)
		} else {
			body = tarGzLoose(entries)
		}
		if body == nil {
			return
		}
		q := url.Values{"path": {"unpacked/dir"}, "format": {format}}
		rec := fs.serve(http.MethodPut, "/v1/files/archive", q.Encode(), body, time.Second)
		checkResponse(t, rec)
		entriesOut, err := os.ReadDir(outside)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entriesOut {
			if e.Name() != "fakesh" && e.Name() != "root" {
				t.Fatalf("an archive wrote %q outside the root", e.Name())
			}
		}
	})
}

// tarGzLoose is tarGz that gives up (nil) where archive/tar refuses to
// write the fuzzed header.
func tarGzLoose(entries []entry) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, Linkname: e.link}
		if e.typ == tar.TypeReg || e.typ == 0 { // 0: the legacy regular-file flag
			h.Size = int64(len(e.body))
		}
		if tw.WriteHeader(h) != nil {
			return nil
		}
		if h.Size > 0 {
			tw.Write([]byte(e.body))
		}
	}
	if tw.Close() != nil || gz.Close() != nil {
		return nil
	}
	return buf.Bytes()
}

// zipOfLoose is zipOf that gives up (nil) where archive/zip refuses.
func zipOfLoose(entries []entry) []byte {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range entries {
		h := &zip.FileHeader{Name: e.name}
		mode := os.FileMode(0o644)
		body := e.body
		switch e.typ {
		case tar.TypeDir:
			mode |= os.ModeDir
		case tar.TypeSymlink:
			mode |= os.ModeSymlink
			body = e.link
		case tar.TypeChar:
			mode |= os.ModeDevice | os.ModeCharDevice
		}
		h.SetMode(mode)
		w, err := zw.CreateHeader(h)
		if err != nil {
			return nil
		}
		io.WriteString(w, body)
	}
	if zw.Close() != nil {
		return nil
	}
	return buf.Bytes()
}
