package handlers_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestEnvironmentWorkspaceMount: a sandbox environment's workspace mount
// is set, shown and edited through the API and the environment's page
// (with the rule explained when refused, and audited); a host has none.
func TestEnvironmentWorkspaceMount(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e, admin := f.e, f.tokens["admin"]
		base := "/api/v1/orgs/acme/environments"
		var env struct {
			ID                 int64
			WorkspaceMount     string `json:"workspace_mount"`
			WorkspaceMountPath string `json:"workspace_mount_path"`
		}

		r := e.json(http.MethodPost, base, admin, map[string]any{"name": "host-m", "kind": "host", "url": "http://10.0.0.7:49984", "os": "linux",
			"deployment": "bare-metal", "agentd_token": strings.Repeat("t", 20), "workspace_mount": "/data/shared/{session}"})
		wantStatus(t, "host with a mount", r, http.StatusBadRequest)
		mustContain(t, "host rule", r.envelope(t).Error.Fields["workspace_mount"], "sandbox environments")
		r = e.json(http.MethodPost, base, admin, map[string]any{"name": "host-m", "kind": "host", "url": "http://10.0.0.7:49984", "os": "linux",
			"deployment": "bare-metal", "agentd_token": strings.Repeat("t", 20)})
		wantStatus(t, "host", r, http.StatusCreated)
		r.decode(t, &env)
		if strings.Contains(string(r.body), "workspace_mount") {
			t.Errorf("a host shows a workspace mount: %s", r.body)
		}
		hostPage := e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/environments/%d", env.ID),
			cookies: []*http.Cookie{{Name: "gh_org_acme", Value: admin}}})
		if strings.Contains(string(hostPage.body), `data-testid="workspace-mount"`) {
			t.Errorf("a host's page shows a persistent workspace")
		}

		r = e.json(http.MethodPost, base, admin, map[string]any{"name": "cube", "kind": "sandbox", "url": "http://cube-api:3000",
			"sandbox_domain": "cube.app", "agentd_token": strings.Repeat("t", 20), "workspace_mount": "/data/shared/{org}/{session}/"})
		wantStatus(t, "sandbox with a mount", r, http.StatusCreated)
		r.decode(t, &env)
		if env.WorkspaceMount != "/data/shared/{org}/{session}" || env.WorkspaceMountPath != "" {
			t.Fatalf("created %+v", env)
		}
		path := fmt.Sprintf("%s/%d", base, env.ID)
		r = e.json(http.MethodPatch, path, admin, map[string]any{"workspace_mount": "/srv/nfs/{session}"})
		wantStatus(t, "mount outside the prefix", r, http.StatusBadRequest)
		mustContain(t, "prefix rule", r.envelope(t).Error.Fields["workspace_mount"], "/data/shared/")
		r = e.json(http.MethodPatch, path, admin, map[string]any{"workspace_mount_path": "/workspace"})
		wantStatus(t, "set the mount path", r, http.StatusOK)
		r.decode(t, &env)
		if env.WorkspaceMount != "/data/shared/{org}/{session}" || env.WorkspaceMountPath != "/workspace" {
			t.Fatalf("after patch %+v", env)
		}

		const csrf = "mount-csrf-token-0123456789"
		ck := []*http.Cookie{{Name: "gh_org_acme", Value: admin}, {Name: "gh_csrf", Value: csrf}}
		page := fmt.Sprintf("/o/acme/environments/%d", env.ID)
		pr := e.do(request{method: http.MethodGet, path: page, cookies: ck})
		wantStatus(t, "environment page", pr, http.StatusOK)
		mustContain(t, "page shows the mount", string(pr.body), `data-testid="workspace-mount"`, "/data/shared/{org}/{session}</code> mounted at <code>/workspace",
			`name="workspace_mount" value="/data/shared/{org}/{session}"`, `name="workspace_mount_path" value="/workspace"`)

		post := func(mount string) response {
			form := url.Values{"_csrf": {csrf}, "workspace_mount": {mount}, "workspace_mount_path": {""}}
			return e.do(request{method: http.MethodPost, path: page, contentType: "application/x-www-form-urlencoded",
				body: strings.NewReader(form.Encode()), cookies: ck})
		}
		pr = post("/data/shared/{user}")
		wantStatus(t, "page refuses a bad template", pr, http.StatusBadRequest)
		mustContain(t, "page explains", string(pr.body), "{session} placeholder", `value="/data/shared/{user}"`)
		pr = post("/data/shared/team/{session}")
		if pr.status != http.StatusSeeOther {
			t.Fatalf("page edit: %d %s", pr.status, pr.body)
		}
		env.WorkspaceMount, env.WorkspaceMountPath = "", "" // omitted when empty
		e.json(http.MethodGet, path, admin, nil).decode(t, &env)
		if env.WorkspaceMount != "/data/shared/team/{session}" || env.WorkspaceMountPath != "" {
			t.Fatalf("after the page edit %+v", env)
		}
		mustContain(t, "audited", string(e.json(http.MethodGet, "/api/v1/orgs/acme/audit?limit=100", admin, nil).body),
			`"workspace_mount":"/data/shared/team/{session}"`)
	})
}
