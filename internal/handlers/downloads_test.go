package handlers_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestAgentdDownloads: anyone, signed in or not, downloads agentd for the
// console's own platform (its own binary) and for the platforms of the
// release directory; SHA256SUMS lists each as sha256sum -c reads it, with
// the hash of the bytes served; HEAD answers the headers; an unknown
// platform is a 404 naming the platforms there are.
func TestAgentdDownloads(t *testing.T) {
	t.Parallel()
	self := filepath.Join(t.TempDir(), "console")
	dir := t.TempDir()
	files := map[string][]byte{
		self:                                     []byte("the console's own binary, agentd under that name"),
		filepath.Join(dir, "agentd-linux-arm64"): []byte("an arm64 build"),
		filepath.Join(dir, "agentd-windows-amd64.exe"): []byte("a windows build"),
		filepath.Join(dir, "agentd-windows-arm64"):     []byte("no .exe: not a windows build"),
		filepath.Join(dir, "README"):                   []byte("not a build"),
	}
	for p, b := range files {
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e := newEnv(t, store.SQLite, func(c *config.Config) { c.AgentdSelf, c.AgentdDir = self, dir })
	own := runtime.GOOS + "-" + runtime.GOARCH
	want := map[string]struct {
		body     []byte
		filename string
	}{
		own:             {files[self], "agentd"},
		"linux-arm64":   {files[filepath.Join(dir, "agentd-linux-arm64")], "agentd"},
		"windows-amd64": {files[filepath.Join(dir, "agentd-windows-amd64.exe")], "agentd.exe"},
	}

	sums := e.do(request{method: http.MethodGet, path: "/downloads/agentd/SHA256SUMS"})
	wantStatus(t, "SHA256SUMS", sums, http.StatusOK)
	if ct := sums.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("SHA256SUMS Content-Type %q", ct)
	}
	listed := map[string]string{}
	line := regexp.MustCompile(`^([0-9a-f]{64})  (agentd-[a-z0-9]+-[a-z0-9]+(?:\.exe)?)$`)
	for _, l := range strings.Split(strings.TrimSuffix(string(sums.body), "\n"), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("SHA256SUMS line %q is not in sha256sum's format; body:\n%s", l, sums.body)
		}
		listed[m[2]] = m[1]
	}
	if len(listed) != len(want) {
		t.Errorf("SHA256SUMS lists %v, want %d builds", listed, len(want))
	}

	for platform, w := range want {
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			r := e.do(request{method: method, path: "/downloads/agentd/" + platform})
			wantStatus(t, method+" "+platform, r, http.StatusOK)
			if ct := r.header.Get("Content-Type"); ct != "application/octet-stream" {
				t.Errorf("%s %s: Content-Type %q", method, platform, ct)
			}
			if cl := r.header.Get("Content-Length"); cl != strconv.Itoa(len(w.body)) {
				t.Errorf("%s %s: Content-Length %q, want %d", method, platform, cl, len(w.body))
			}
			if cd := r.header.Get("Content-Disposition"); cd != `attachment; filename="`+w.filename+`"` {
				t.Errorf("%s %s: Content-Disposition %q", method, platform, cd)
			}
			if method == http.MethodHead {
				if len(r.body) != 0 {
					t.Errorf("HEAD %s has a body of %d bytes", platform, len(r.body))
				}
				continue
			}
			if string(r.body) != string(w.body) {
				t.Errorf("GET %s served %q", platform, r.body)
			}
			sum := sha256.Sum256(r.body)
			name := "agentd-" + platform
			if strings.HasPrefix(platform, "windows-") {
				name += ".exe"
			}
			if listed[name] != hex.EncodeToString(sum[:]) {
				t.Errorf("SHA256SUMS says %s is %q; the bytes served hash to %x", name, listed[name], sum)
			}
		}
	}

	// A build replaced in place is hashed again.
	arm := filepath.Join(dir, "agentd-linux-arm64")
	if err := os.WriteFile(arm, []byte("a newer arm64 build, longer"), 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("a newer arm64 build, longer"))
	if again := e.do(request{method: http.MethodGet, path: "/downloads/agentd/SHA256SUMS"}); !strings.Contains(string(again.body), hex.EncodeToString(sum[:])+"  agentd-linux-arm64\n") {
		t.Errorf("SHA256SUMS after the arm64 build changed:\n%s", again.body)
	}

	for _, platform := range []string{"plan9-mips", "windows-arm64", "README"} {
		r := e.do(request{method: http.MethodGet, path: "/downloads/agentd/" + platform})
		wantStatus(t, platform, r, http.StatusNotFound)
		env := r.envelope(t)
		if env.Error.Code != "no_agentd_build" || !strings.Contains(env.Error.Message, platform) ||
			!strings.Contains(env.Error.Message, "linux-arm64, "+own) && !strings.Contains(env.Error.Message, own+", linux-arm64") {
			t.Errorf("GET %s: %+v, want no_agentd_build naming it and the platforms there are", platform, env.Error)
		}
	}
}

// TestAgentdDownloadsNone: a console with no builds answers an empty
// SHA256SUMS and a 404 that says how to get some.
func TestAgentdDownloadsNone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	sums := e.do(request{method: http.MethodGet, path: "/downloads/agentd/SHA256SUMS"})
	wantStatus(t, "SHA256SUMS", sums, http.StatusOK)
	if len(sums.body) != 0 {
		t.Errorf("SHA256SUMS without builds: %q", sums.body)
	}
	r := e.do(request{method: http.MethodGet, path: "/downloads/agentd/linux-amd64"})
	wantStatus(t, "linux-amd64", r, http.StatusNotFound)
	if msg := r.envelope(t).Error.Message; !strings.Contains(msg, "scripts/release-agentd") {
		t.Errorf("404 without builds says %q", msg)
	}
}
