package handlers_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/archivetest"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// startFetchingAgentd is startCountingAgentd whose downloads trust the
// test's TLS server (agentd fetches https:// skills).
func startFetchingAgentd(t *testing.T, fetch *http.Client) *countingAgentd {
	t.Helper()
	a := &countingAgentd{token: "agentd-token-" + randomHex(12), root: t.TempDir()}
	srv, err := agentd.NewServer(agentd.Config{Token: a.token, Root: a.root, FetchClient: fetch})
	if err != nil {
		t.Fatal(err)
	}
	a.srv = srv
	a.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			a.requests.Add(1)
			a.mu.Lock()
			a.calls = append(a.calls, r.Method+" "+r.URL.Path)
			a.mu.Unlock()
		}
		srv.Handler().ServeHTTP(w, r)
	}))
	a.url = a.ts.URL
	t.Cleanup(func() {
		srv.Close()
		a.ts.Close()
	})
	return a
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

type prepJSON struct {
	State       string `json:"state"`
	Reason      string `json:"reason"`
	Preparation *struct {
		Status string `json:"status"`
		Reason string `json:"reason"`
		Items  []struct {
			Kind, Name, Source, Path, SHA256, Status, Error string
			Size                                            int64
		} `json:"items"`
	} `json:"preparation"`
}

// TestSessionPreparation: an agent with three skills (an https archive, a
// directory already on the host, an uploaded bundle) and one uploaded
// file. The session's first command finds them in place; its page and API
// list them verified; one session.prepare event carries their hashes. A
// pin that does not match, or a source that cannot be fetched, leaves a
// session pending with the reason, and no command reaches agentd; the
// retry prepares it once the agent is fixed. Issue 24.
func TestSessionPreparation(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		// Every use looks at the session again rather than at a cached
		// answer, as it does once the refresh interval passed.
		f.e.c.SessionsRT.RefreshEvery = time.Nanosecond
		fmtBundle := archivetest.TarGz(t, map[string]string{"fmt/SKILL.md": "# fmt skill\n", "fmt/run.sh": "echo fmt\n"})
		skills := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/skills/fmt.tar.gz":
				_, _ = w.Write(fmtBundle)
			case "/skills/tool.sh":
				_, _ = w.Write([]byte("echo tool\n"))
			default:
				http.NotFound(w, r)
			}
		}))
		t.Cleanup(skills.Close)
		a := startFetchingAgentd(t, skills.Client())
		agentID, sessionID := f.hostSession(t, "prep-host", a.url, a.token)
		shared := filepath.Join(a.root, "shared", "lint")
		if err := os.MkdirAll(shared, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(shared, "lint.sh"), []byte("echo lint\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		docs := archivetest.Zip(t, map[string]string{"DOCS.md": "# docs skill\n"})
		brief := []byte("the brief of the task\n")
		agentPath := fmt.Sprintf("/api/v1/orgs/acme/agents/%d", agentID)
		owner := f.tokens["owner"]

		t.Run("the owner uploads a bundle (raw body) and a file (form)", func(t *testing.T) {
			r := f.e.do(request{method: http.MethodPost, path: agentPath + "/uploads?kind=skill&name=docs-bundle&filename=docs.zip",
				body: bytes.NewReader(docs), contentType: "application/octet-stream", token: owner})
			wantStatus(t, "upload bundle", r, http.StatusOK)
			var body bytes.Buffer
			mw := multipart.NewWriter(&body)
			_ = mw.WriteField("kind", "file")
			_ = mw.WriteField("name", "notes/brief.md")
			fw, _ := mw.CreateFormFile("file", "brief.md")
			_, _ = fw.Write(brief)
			_ = mw.Close()
			r = f.e.do(request{method: http.MethodPost, path: agentPath + "/uploads", body: &body, contentType: mw.FormDataContentType(), token: owner})
			wantStatus(t, "upload file", r, http.StatusOK)
			var u struct{ SHA256 string }
			r.decode(t, &u)
			if u.SHA256 != sha256Hex(brief) {
				t.Fatalf("stored hash %s, want %s", u.SHA256, sha256Hex(brief))
			}
			r = f.e.do(request{method: http.MethodPost, path: agentPath + "/uploads?kind=file&name=x.bin",
				body: bytes.NewReader([]byte("x")), contentType: "application/octet-stream", token: f.tokens["member"]})
			wantStatus(t, "a member may not upload", r, http.StatusForbidden)
			r = f.e.do(request{method: http.MethodPost, path: agentPath + "/uploads?kind=file&name=big.bin",
				body: bytes.NewReader(make([]byte, 52<<20)), contentType: "application/octet-stream", token: owner})
			wantStatus(t, "an upload over 50 MiB", r, http.StatusBadRequest)
			if e := r.envelope(t).Error; e.Code != "body_too_large" || !strings.Contains(e.Message, "50 MiB limit per bundle or file") {
				t.Errorf("over-size refusal %+v", e)
			}
			r = f.e.do(request{method: http.MethodPost, path: agentPath + "/uploads?kind=skill&name=broken&filename=broken.tar.gz",
				body: strings.NewReader("not gzip"), contentType: "application/octet-stream", token: owner})
			wantStatus(t, "a bad archive", r, http.StatusBadRequest)
			if e := r.envelope(t).Error; !strings.Contains(e.Fields["file"], "not a readable tar.gz archive") {
				t.Errorf("bad archive refusal %+v", e)
			}
			r = f.e.do(request{method: http.MethodGet, path: agentPath + "/uploads", token: f.tokens["auditor"]})
			wantStatus(t, "the auditor lists metadata", r, http.StatusOK)
			if bytes.Contains(r.body, brief) || !bytes.Contains(r.body, []byte(sha256Hex(brief))) {
				t.Fatalf("listing: %s; want hashes and no contents", r.body)
			}
		})

		setSkills := func(t *testing.T, fmtSource, fmtPin string) {
			t.Helper()
			cfg := map[string]any{"model": "m", "skills": []map[string]string{
				{"name": "fmt", "source": fmtSource, "sha256": fmtPin},
				{"name": "lint", "source": shared},
				{"name": "docs", "source": "upload:docs-bundle", "sha256": sha256Hex(docs)},
				{"name": "tool", "source": skills.URL + "/skills/tool.sh"},
			}}
			r := f.e.json(http.MethodPatch, agentPath, owner, map[string]any{"config": cfg})
			wantStatus(t, "set skills", r, http.StatusOK)
		}
		setSkills(t, skills.URL+"/skills/fmt.tar.gz?sig=secret", sha256Hex(fmtBundle))

		t.Run("the first exec finds every skill and file in place", func(t *testing.T) {
			r := f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/commands", sessionID), "member", map[string]any{
				"command": "cat .skills/fmt/fmt/SKILL.md .skills/lint/lint.sh .skills/docs/DOCS.md notes/brief.md .skills/tool && ls .skills", "wait_ms": 10000})
			wantStatus(t, "exec", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			var out strings.Builder
			for _, ch := range o.Chunks {
				out.Write(ch.Data)
			}
			for _, want := range []string{"# fmt skill", "echo lint", "# docs skill", "the brief of the task", "echo tool", "docs\nfmt\nlint\ntool"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output %q lacks %q (state %s)", out.String(), want, o.State)
				}
			}
		})

		t.Run("the API and the page list them verified", func(t *testing.T) {
			r := f.call(http.MethodGet, fmt.Sprintf("/sessions/%d", sessionID), "member", nil)
			wantStatus(t, "get session", r, http.StatusOK)
			var s prepJSON
			r.decode(t, &s)
			if s.Preparation == nil || s.Preparation.Status != "prepared" || len(s.Preparation.Items) != 5 {
				t.Fatalf("preparation: %s", r.body)
			}
			hashes := map[string]string{"fmt": sha256Hex(fmtBundle), "docs": sha256Hex(docs), "notes/brief.md": sha256Hex(brief)}
			for _, it := range s.Preparation.Items {
				if it.Status != "verified" || (hashes[it.Name] != "" && it.SHA256 != hashes[it.Name]) {
					t.Errorf("item %+v, want verified with sha256 %s", it, hashes[it.Name])
				}
				if strings.Contains(it.Source, "secret") {
					t.Errorf("item %s shows its URL's query: %s", it.Name, it.Source)
				}
			}
			page := f.e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/sessions/%d", sessionID), token: f.tokens["member"]})
			wantStatus(t, "session page", page, http.StatusOK)
			for _, id := range []string{"prep-skill-fmt", "prep-skill-lint", "prep-skill-docs", "prep-skill-tool", "prep-file-notes/brief.md"} {
				if !bytes.Contains(page.body, []byte(`data-testid="`+id+`"`)) {
					t.Errorf("the session page does not list %s", id)
				}
			}
			if n := bytes.Count(page.body, []byte("verified")); n < 5 {
				t.Errorf("the page says verified %d times, want every item", n)
			}
		})

		t.Run("one session.prepare event with the hashes, never contents", func(t *testing.T) {
			var mine []auditEventJSON
			for _, e := range f.auditEvents(t, "action:session.prepare") {
				if e.Target.ID == fmt.Sprint(sessionID) {
					mine = append(mine, e)
				}
			}
			if len(mine) != 1 {
				t.Fatalf("%d session.prepare events, want 1: %+v", len(mine), mine)
			}
			raw := fmt.Sprint(mine[0].Details)
			for _, h := range []string{sha256Hex(fmtBundle), sha256Hex(docs), sha256Hex(brief)} {
				if !strings.Contains(raw, h) {
					t.Errorf("the event lacks hash %s: %s", h, raw)
				}
			}
			if strings.Contains(raw, "the brief of the task") || strings.Contains(raw, "sig=secret") {
				t.Errorf("the event carries contents or a URL's secret: %s", raw)
			}
		})

		t.Run("a host workspace removed on the host is prepared again at the next use", func(t *testing.T) {
			if err := os.RemoveAll(filepath.Join(a.root, "gatehouse-sessions", fmt.Sprint(sessionID))); err != nil {
				t.Fatal(err)
			}
			r := f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/commands", sessionID), "member", map[string]any{
				"command": "cat notes/brief.md .skills/docs/DOCS.md", "wait_ms": 10000})
			wantStatus(t, "exec after the removal", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			var out strings.Builder
			for _, ch := range o.Chunks {
				out.Write(ch.Data)
			}
			if !strings.Contains(out.String(), "the brief of the task") || !strings.Contains(out.String(), "# docs skill") {
				t.Errorf("after the removal the workspace reads %q", out.String())
			}
			n := 0
			for _, e := range f.auditEvents(t, "action:session.prepare") {
				if e.Target.ID == fmt.Sprint(sessionID) {
					n++
				}
			}
			if n != 2 {
				t.Errorf("%d session.prepare events, want 2 (the first and after the removal)", n)
			}
		})

		// A fresh session of the agent, whose preparation must fail.
		failing := func(t *testing.T, wantReason string) int64 {
			t.Helper()
			r := f.call(http.MethodPost, "/sessions", "member", map[string]any{"agent_id": agentID})
			wantStatus(t, "new session", r, http.StatusCreated)
			var sess struct{ ID int64 }
			r.decode(t, &sess)
			before := len(a.callsSince(0))
			r = f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/commands", sess.ID), "member", map[string]any{"command": "touch ran-here", "wait_ms": 5000})
			wantStatus(t, "exec in an unprepared session", r, http.StatusConflict)
			if e := r.envelope(t).Error; e.Code != "session_not_prepared" || !strings.Contains(e.Message, wantReason) {
				t.Fatalf("refusal %+v, want session_not_prepared saying %q", e, wantReason)
			}
			execs := 0
			for _, c := range a.callsSince(before) {
				if c == "POST /v1/sessions" {
					execs++
				}
			}
			if execs != 1 { // the workspace's mkdir, nothing else
				t.Errorf("agentd ran %d commands (%v), want only the workspace's mkdir", execs, a.callsSince(before))
			}
			matches, _ := filepath.Glob(filepath.Join(a.root, "*", "*", "ran-here"))
			if len(matches) > 0 {
				t.Errorf("the command ran: %v", matches)
			}
			r = f.call(http.MethodGet, fmt.Sprintf("/sessions/%d", sess.ID), "member", nil)
			var s prepJSON
			r.decode(t, &s)
			if s.State != "pending" || !strings.Contains(s.Reason, wantReason) || s.Preparation == nil || s.Preparation.Status != "failed" {
				t.Fatalf("session after a failed preparation: %s", r.body)
			}
			return sess.ID
		}

		t.Run("a sha256 that does not match leaves the session pending", func(t *testing.T) {
			setSkills(t, skills.URL+"/skills/fmt.tar.gz", strings.Repeat("0", 64))
			failing(t, "sha256 mismatch")
		})

		t.Run("removing an upload on the page asks for its name", func(t *testing.T) {
			remove := func(confirm string) {
				t.Helper()
				csrf := "prep-csrf-token-0123456789"
				form := "kind=file&name=notes%2Fbrief.md&confirm=" + confirm
				r := f.e.do(request{method: http.MethodPost, path: fmt.Sprintf("/o/acme/agents/%d/uploads/remove", agentID), body: strings.NewReader(form),
					contentType: "application/x-www-form-urlencoded", header: http.Header{"X-Csrf-Token": {csrf}},
					cookies: []*http.Cookie{{Name: "gh_org_acme", Value: owner}, {Name: "gh_csrf", Value: csrf}}})
				wantStatus(t, "remove", r, http.StatusSeeOther)
			}
			listed := func() bool {
				r := f.e.do(request{method: http.MethodGet, path: agentPath + "/uploads", token: owner})
				return bytes.Contains(r.body, []byte(`"notes/brief.md"`))
			}
			remove("brief")
			if !listed() {
				t.Fatal("a mistyped confirmation removed the file")
			}
			remove("notes%2Fbrief.md")
			if listed() {
				t.Fatal("the confirmed removal left the file")
			}
			var removed int
			for _, e := range f.auditEvents(t, "action:agent.upload_remove") {
				if strings.Contains(fmt.Sprint(e.Details), sha256Hex(brief)) {
					removed++
				}
			}
			if removed != 1 {
				t.Errorf("%d agent.upload_remove events with the file's hash, want 1", removed)
			}
		})

		t.Run("an unreachable source leaves the session pending; the retry prepares it once fixed", func(t *testing.T) {
			setSkills(t, skills.URL+"/skills/gone.tar.gz", "")
			id := failing(t, "could not fetch")
			r := f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/prepare", id), "member", nil)
			wantStatus(t, "retry while still broken", r, http.StatusConflict)
			setSkills(t, skills.URL+"/skills/fmt.tar.gz", sha256Hex(fmtBundle))
			r = f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/prepare", id), "member", nil)
			wantStatus(t, "retry", r, http.StatusOK)
			var s prepJSON
			r.decode(t, &s)
			if s.State != "running" || s.Preparation == nil || s.Preparation.Status != "prepared" {
				t.Fatalf("after the retry: %s", r.body)
			}
		})
	})
}
