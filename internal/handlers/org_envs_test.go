package handlers_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

type envOut struct {
	ID             int64
	Name           string
	Kind           string
	Private        bool
	APIKeySet      bool `json:"api_key_set"`
	AgentdTokenSet bool `json:"agentd_token_set"`
	Health         struct {
		Status        string
		Error         string
		AgentdVersion string `json:"agentd_version"`
	}
}

func TestEnvironmentsScopingAndSecrets(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e := f.e
		agentdURL, agentdToken := agentdtest.Start(t)
		const apiKey = "e2b_known-backend-api-key-0123456789"
		fake := e2bfaketest.New(t, agentdBin, e2bfake.Config{APIKey: apiKey, Templates: []e2bfake.Template{
			{ID: "tpl-base", Aliases: []string{"base"}, CPU: 2, MemoryMB: 2048, DiskSizeMB: 10240},
		}})
		owner, member, plain, admin := f.tokens["owner"], f.tokens["member"], f.tokens["plain"], f.tokens["admin"]
		base := "/api/v1/orgs/acme/environments"

		// A department owner adds a department host; a member may not.
		hostReq := map[string]any{"name": "build-01", "kind": "host", "department_id": f.dept1, "url": agentdURL,
			"os": "linux", "deployment": "bare-metal", "agentd_token": agentdToken}
		wantStatus(t, "member adds shared env", e.json(http.MethodPost, base, member, hostReq), http.StatusForbidden)
		r := e.json(http.MethodPost, base, owner, hostReq)
		wantStatus(t, "owner adds dept env", r, http.StatusCreated)
		var host envOut
		r.decode(t, &host)
		if !host.AgentdTokenSet || host.Private {
			t.Fatalf("host env: %+v", host)
		}

		// An owner cannot move their department's environment org-wide.
		r = e.json(http.MethodPatch, fmt.Sprintf("%s/%d", base, host.ID), owner, map[string]any{"department_id": 0})
		wantStatus(t, "owner makes env org-wide", r, http.StatusBadRequest)
		mustContain(t, "move rule", r.envelope(t).Error.Fields["department_id"], "may not move")

		// Test connection reaches the real agentd.
		r = e.json(http.MethodPost, fmt.Sprintf("%s/%d/test", base, host.ID), owner, nil)
		wantStatus(t, "test connection", r, http.StatusOK)
		r.decode(t, &host)
		if host.Health.Status != "healthy" || host.Health.AgentdVersion == "" {
			t.Fatalf("health after test: %+v", host.Health)
		}

		// A sandbox backend at the org level, by an admin, with its templates.
		r = e.json(http.MethodPost, base, admin, map[string]any{"name": "cube", "kind": "sandbox", "url": fake.URL(),
			"sandbox_domain": fake.Domain(), "sandbox_scheme": "http", "api_key": apiKey, "agentd_token": agentdToken})
		wantStatus(t, "admin adds sandbox env", r, http.StatusCreated)
		var sb envOut
		r.decode(t, &sb)
		wantStatus(t, "owner cannot import into org env", e.json(http.MethodPost, fmt.Sprintf("%s/%d/templates", base, sb.ID), owner,
			map[string]any{"import": true, "backend_template_id": "tpl-base"}), http.StatusForbidden)
		r = e.json(http.MethodPost, fmt.Sprintf("%s/%d/templates", base, sb.ID), admin, map[string]any{"import": true, "backend_template_id": "tpl-base"})
		wantStatus(t, "import template", r, http.StatusCreated)
		mustContain(t, "imported template", string(r.body), `"vcpu":2`, `"memory_mb":2048`, `"envd":49983`, `"agentd":49984`)
		r = e.json(http.MethodPost, fmt.Sprintf("%s/%d/test", base, sb.ID), admin, nil)
		wantStatus(t, "test sandbox env", r, http.StatusOK)
		r.decode(t, &sb)
		if sb.Health.Status != "healthy" {
			t.Fatalf("sandbox health: %+v", sb.Health)
		}

		// A member registers a private workstation: invisible to others.
		laptop := map[string]any{"name": "plain-laptop", "kind": "host", "private": true,
			"url": "http://127.0.0.1:1", "os": "macos", "deployment": "bare-metal", "agentd_token": "laptop-token-0123456789"}
		for _, target := range []string{"http://127.0.0.1:1", "http://localhost:49984", "http://169.254.169.254/latest", "http://[::1]:49984"} {
			laptop["url"] = target
			r = e.json(http.MethodPost, base, plain, laptop)
			wantStatus(t, "private env at "+target, r, http.StatusBadRequest)
			mustContain(t, "private target rule", r.envelope(t).Error.Fields["url"], "loopback")
		}
		laptop["url"] = "http://192.0.2.10:49984" // TEST-NET-1: never answers
		r = e.json(http.MethodPost, base, plain, laptop)
		wantStatus(t, "private env", r, http.StatusCreated)
		var priv envOut
		r.decode(t, &priv)
		privPath := fmt.Sprintf("%s/%d", base, priv.ID)
		for _, who := range []string{"member", "owner"} {
			rr := e.json(http.MethodGet, privPath, f.tokens[who], nil)
			wantStatus(t, who+" reads private env", rr, http.StatusNotFound)
			if env := rr.envelope(t); env.Error.Code != "not_found" {
				t.Fatalf("hidden env must look missing, got code %q", env.Error.Code)
			}
			wantStatus(t, who+" deletes private env", e.json(http.MethodDelete, privPath, f.tokens[who], nil), http.StatusNotFound)
		}
		// Auditors read every environment a session may stand on (issue
		// 26 item 15), private ones too, and change none.
		wantStatus(t, "auditor reads private env", e.json(http.MethodGet, privPath, f.tokens["auditor"], nil), http.StatusOK)
		wantStatus(t, "auditor deletes private env", e.json(http.MethodDelete, privPath, f.tokens["auditor"], nil), http.StatusForbidden)
		wantStatus(t, "missing env looks the same", e.json(http.MethodGet, base+"/999999", member, nil), http.StatusNotFound)

		// A machine registers itself at boot with its user's personal key;
		// a service key, which belongs to nobody, cannot own one.
		boot := map[string]any{"name": "member-workstation", "kind": "host", "private": true, "url": "http://192.0.2.11:49984",
			"os": "linux", "deployment": "cloud-vm", "agentd_token": "workstation-token-0123456789"}
		r = e.json(http.MethodPost, base, f.keys["member-key"], boot)
		wantStatus(t, "register by personal key", r, http.StatusCreated)
		mustContain(t, "owned by the key's user", string(r.body), `"private":true`, fmt.Sprintf(`"owner_user_id":%d`, f.ids["member"]))
		boot["name"] = "bot-workstation"
		wantStatus(t, "register by service key", e.json(http.MethodPost, base, f.keys["auditor-key"], boot), http.StatusForbidden)
		wantStatus(t, "owner reads own", e.json(http.MethodGet, privPath, plain, nil), http.StatusOK)
		wantStatus(t, "admin reads private", e.json(http.MethodGet, privPath, admin, nil), http.StatusOK)
		var list struct{ Items []envOut }
		e.json(http.MethodGet, base, member, nil).decode(t, &list)
		names := []string{}
		for _, x := range list.Items {
			names = append(names, x.Name)
		}
		if strings.Join(names, ",") != "build-01,cube,member-workstation" {
			t.Fatalf("member sees %v, want build-01, cube and their own workstation (not plain's laptop)", names)
		}
		e.json(http.MethodGet, base, f.tokens["auditor"], nil).decode(t, &list)
		names = names[:0]
		for _, x := range list.Items {
			names = append(names, x.Name)
		}
		if strings.Join(names, ",") != "build-01,cube,member-workstation,plain-laptop" {
			t.Fatalf("auditor (no department) sees %v, want every environment", names)
		}

		// An agent of Research on build-01; members see it, cannot change it.
		agentReq := map[string]any{"name": "triage", "department_id": f.dept1, "config": map[string]any{"model": "claude-sonnet-4"},
			"environment_ids": []int64{host.ID}, "sandbox_mode": "off"}
		r = e.json(http.MethodPost, "/api/v1/orgs/acme/agents", owner, agentReq)
		wantStatus(t, "owner creates agent", r, http.StatusCreated)
		var ag struct {
			ID                   int64
			DefaultEnvironmentID int64 `json:"default_environment_id"`
			IdleTimeoutSeconds   int   `json:"idle_timeout_seconds"`
			ReclaimAfterSeconds  int   `json:"reclaim_after_seconds"`
		}
		r.decode(t, &ag)
		if ag.DefaultEnvironmentID != host.ID || ag.IdleTimeoutSeconds != 900 || ag.ReclaimAfterSeconds != 3600 {
			t.Fatalf("agent defaults: %+v", ag)
		}
		agentPath := fmt.Sprintf("/api/v1/orgs/acme/agents/%d", ag.ID)
		wantStatus(t, "member reads agent", e.json(http.MethodGet, agentPath, member, nil), http.StatusOK)
		wantStatus(t, "member updates agent", e.json(http.MethodPatch, agentPath, member, map[string]any{"description": "x"}), http.StatusForbidden)
		wantStatus(t, "plain reads dept agent", e.json(http.MethodGet, agentPath, plain, nil), http.StatusNotFound)
		wantStatus(t, "env in use", e.json(http.MethodDelete, fmt.Sprintf("%s/%d", base, host.ID), owner, nil), http.StatusConflict)

		// Validation explains each rule.
		r = e.json(http.MethodPatch, agentPath, owner, map[string]any{"sandbox_mode": "per-session"})
		wantStatus(t, "per-session without sandbox env", r, http.StatusBadRequest)
		mustContain(t, "per-session rule", r.envelope(t).Error.Fields["sandbox_mode"], "sandbox environment")
		r = e.json(http.MethodPost, "/api/v1/orgs/acme/agents", owner, map[string]any{"name": "bad", "department_id": f.dept1,
			"config": map[string]any{"modle": "x"}, "environment_ids": []int64{priv.ID}})
		wantStatus(t, "bad agent", r, http.StatusBadRequest)
		fields := r.envelope(t).Error.Fields
		mustContain(t, "config rule", fields["config"], "modle")
		mustContain(t, "env rule", fields["environment_ids"], "may not use")

		// Replacing a secret keeps it sealed; leaving it out keeps it.
		const newToken = "replaced-agentd-token-abcdefghijkl"
		r = e.json(http.MethodPatch, fmt.Sprintf("%s/%d", base, host.ID), owner, map[string]any{"agentd_token": newToken})
		wantStatus(t, "replace token", r, http.StatusOK)

		// No secret anywhere: API responses, pages, audit, logs.
		secrets := []string{agentdToken, apiKey, "laptop-token-0123456789", newToken, "workstation-token-0123456789"}
		var seen strings.Builder
		for _, path := range []string{base, fmt.Sprintf("%s/%d", base, host.ID), fmt.Sprintf("%s/%d", base, sb.ID), privPath,
			fmt.Sprintf("%s/%d/templates", base, sb.ID), "/api/v1/orgs/acme/audit?limit=100", "/api/v1/orgs/acme/audit/export?format=jsonl",
			"/api/v1/orgs/acme/audit/export?format=csv", "/api/v1/orgs/acme/agents"} {
			seen.Write(e.json(http.MethodGet, path, admin, nil).body)
		}
		ck := &http.Cookie{Name: "gh_org_acme", Value: admin}
		for _, path := range []string{"/o/acme/environments", fmt.Sprintf("/o/acme/environments/%d", host.ID),
			fmt.Sprintf("/o/acme/environments/%d", sb.ID), fmt.Sprintf("/o/acme/environments/%d", priv.ID), "/o/acme/audit", "/o/acme/agents"} {
			pr := e.do(request{method: http.MethodGet, path: path, cookies: []*http.Cookie{ck}})
			wantStatus(t, "page "+path, pr, http.StatusOK)
			seen.Write(pr.body)
		}
		seen.WriteString(e.logs.String())
		mustContain(t, "audit of environment changes", seen.String(), "environment.create", "environment.update", "[redacted")
		for _, s := range secrets {
			if strings.Contains(seen.String(), s) {
				t.Fatalf("secret %q leaked into a response, page, audit record or log line", s)
			}
		}
	})
}
