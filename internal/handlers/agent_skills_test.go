package handlers_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/archivetest"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestAgentSkillsPage: the agent page lists the agent's skills and adds
// them by URL (with a pin) or by uploading a bundle, which is stored and
// attached as upload:<name> pinned to its hash, and removes them; each
// change is an audited agent update. A bad field is shown beside it; a
// reader sees the list without forms and is refused on POST. Issue 41.
func TestAgentSkillsPage(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.SQLite)
	const csrf = "skills-csrf-token-0123456789"
	base := fmt.Sprintf("/o/acme/agents/%d", f.agentID)
	post := func(path, who string, fields map[string]string, file []byte) response {
		t.Helper()
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		_ = mw.WriteField("_csrf", csrf)
		for k, v := range fields {
			_ = mw.WriteField(k, v)
		}
		if file != nil {
			fw, _ := mw.CreateFormFile("file", "bundle.tar.gz")
			_, _ = fw.Write(file)
		}
		_ = mw.Close()
		return f.e.do(request{method: http.MethodPost, path: base + path, body: &body, contentType: mw.FormDataContentType(),
			cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens[who]}, {Name: "gh_csrf", Value: csrf}}})
	}
	get := func(who string) string {
		t.Helper()
		r := f.e.do(request{method: http.MethodGet, path: base, cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens[who]}}})
		wantStatus(t, "agent page", r, http.StatusOK)
		return string(r.body)
	}
	skills := func() map[string]map[string]string {
		t.Helper()
		var a struct{ Config json.RawMessage }
		f.call(http.MethodGet, fmt.Sprintf("/agents/%d", f.agentID), "owner", nil).decode(t, &a)
		var cfg struct{ Skills []map[string]string }
		if err := json.Unmarshal(a.Config, &cfg); err != nil {
			t.Fatal(err)
		}
		out := map[string]map[string]string{}
		for _, s := range cfg.Skills {
			out[s["name"]] = s
		}
		return out
	}
	pin := strings.Repeat("ab", 32)
	bundle := archivetest.TarGz(t, map[string]string{"SKILL.md": "# tools\n"})

	t.Run("an empty list and the form for who may change the agent", func(t *testing.T) {
		body := get("owner")
		for _, want := range []string{`data-testid="skills-empty"`, `data-testid="add-skill-form"`, `id="config"`} {
			if !strings.Contains(body, want) {
				t.Errorf("the owner's agent page has no %s", want)
			}
		}
	})
	t.Run("add by URL with a pin", func(t *testing.T) {
		r := post("/skills", "owner", map[string]string{"name": "fmt", "kind": "url", "url": "https://skills.example/fmt.tar.gz?sig=secret", "sha256": pin}, nil)
		wantStatus(t, "add by URL", r, http.StatusSeeOther)
		if s := skills()["fmt"]; s["source"] != "https://skills.example/fmt.tar.gz?sig=secret" || s["sha256"] != pin {
			t.Fatalf("skill fmt = %v", s)
		}
		body := get("owner")
		_, list, _ := strings.Cut(body, `id="skills"`)
		list, _, _ = strings.Cut(list, `data-testid="add-skill-form"`)
		if !strings.Contains(list, `data-testid="skill-fmt"`) || !strings.Contains(list, pin) || strings.Contains(list, "sig=secret") {
			t.Errorf("the list does not show fmt pinned (and without its URL's secret): %.3000s", body)
		}
	})
	t.Run("add by uploading a bundle", func(t *testing.T) {
		r := post("/skills", "owner", map[string]string{"name": "tools", "kind": "upload"}, bundle)
		wantStatus(t, "add by upload", r, http.StatusSeeOther)
		if s := skills()["tools"]; s["source"] != "upload:tools" || s["sha256"] != sha256Hex(bundle) {
			t.Fatalf("skill tools = %v, want upload:tools pinned to %s", s, sha256Hex(bundle))
		}
		body := get("owner")
		if !strings.Contains(body, `data-testid="upload-skill-tools"`) || !strings.Contains(body, `data-testid="skill-tools"`) {
			t.Errorf("the bundle or the skill is not listed: %.3000s", body)
		}
		if len(f.auditEvents(t, "action:agent.upload")) == 0 {
			t.Error("the upload was not audited")
		}
	})
	t.Run("refusals are shown beside their field", func(t *testing.T) {
		for _, tc := range []struct {
			fields map[string]string
			file   []byte
			testID string
		}{
			{map[string]string{"name": "Bad Name", "kind": "url", "url": "https://x.example/a.zip"}, nil, "skill-name-error"},
			{map[string]string{"name": "fmt", "kind": "url", "url": "https://x.example/a.zip"}, nil, "skill-name-error"},
			{map[string]string{"name": "lint", "kind": "url", "url": "ftp://x"}, nil, "skill-url-error"},
			{map[string]string{"name": "lint", "kind": "url", "url": "https://x.example/a.zip", "sha256": "xyz"}, nil, "skill-sha256-error"},
			{map[string]string{"name": "lint", "kind": "path", "path": "/opt/lint", "sha256": pin}, nil, "skill-sha256-error"},
			{map[string]string{"name": "lint", "kind": "upload"}, nil, "skill-file-error"},
			{map[string]string{"name": "lint", "kind": "upload"}, []byte("not an archive"), "skill-file-error"},
			// A skill refused stores no bundle either.
			{map[string]string{"name": "fmt", "kind": "upload"}, bundle, "skill-name-error"},
		} {
			r := post("/skills", "owner", tc.fields, tc.file)
			wantStatus(t, fmt.Sprint("refused ", tc.fields), r, http.StatusBadRequest)
			if !strings.Contains(string(r.body), `data-testid="`+tc.testID+`"`) || !strings.Contains(string(r.body), `data-testid="skill-form-error"`) {
				t.Errorf("%v: no %s on the page", tc.fields, tc.testID)
			}
		}
		if got := skills(); len(got) != 2 {
			t.Errorf("refused adds changed the skills: %v", got)
		}
		if body := get("owner"); strings.Contains(body, `data-testid="upload-skill-fmt"`) || strings.Contains(body, `data-testid="upload-skill-lint"`) {
			t.Error("a refused skill left its bundle stored")
		}
	})
	t.Run("a reader sees the list without forms and is refused", func(t *testing.T) {
		body := get("member")
		if !strings.Contains(body, `data-testid="skill-fmt"`) || strings.Contains(body, `data-testid="add-skill-form"`) || strings.Contains(body, `remove-skill-fmt`) {
			t.Errorf("the member's page: %.3000s", body)
		}
		r := post("/skills", "member", map[string]string{"name": "x", "kind": "url", "url": "https://x.example/x"}, nil)
		wantStatus(t, "a member adds", r, http.StatusForbidden)
		r = post("/skills/remove", "member", map[string]string{"name": "fmt"}, nil)
		wantStatus(t, "a member removes", r, http.StatusForbidden)
	})
	t.Run("remove, as an audited agent update", func(t *testing.T) {
		before := len(f.auditEvents(t, "action:agent.update"))
		r := post("/skills/remove", "owner", map[string]string{"name": "fmt"}, nil)
		wantStatus(t, "remove", r, http.StatusSeeOther)
		if got := skills(); got["fmt"] != nil || got["tools"] == nil {
			t.Fatalf("after removing fmt: %v", got)
		}
		if after := len(f.auditEvents(t, "action:agent.update")); after != before+1 {
			t.Errorf("agent.update events %d → %d, want one more", before, after)
		}
		r = post("/skills/remove", "owner", map[string]string{"name": "tools"}, nil)
		wantStatus(t, "remove the uploaded skill", r, http.StatusSeeOther)
		body := get("owner")
		if !strings.Contains(body, `data-testid="skills-empty"`) || !strings.Contains(body, `data-testid="upload-skill-tools"`) {
			t.Errorf("after removing tools, the list is not empty or its bundle is gone: %.3000s", body)
		}
	})
}
