package handlers_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
)

type sessionOut struct {
	ID        int64  `json:"id"`
	AgentID   int64  `json:"agent_id"`
	State     string `json:"state"`
	Reason    string `json:"reason"`
	Workspace string `json:"workspace"`
}

// TestSessionRoutes is the route matrix's per-object half for sessions:
// every session route, as every kind of principal, against a session a
// member of department 1 started on a department-1 agent. Sessions of
// another department or org are 404; auditors read but may not act.
func TestSessionRoutes(t *testing.T) {
	t.Parallel()
	f := newOrgFixture(t, store.SQLite)
	e := f.e
	root := f.tokens["entered-admin"]
	base := "/api/v1/orgs/acme"
	url, token := agentdtest.Start(t, agentdtest.WithRoot(t.TempDir()))
	r := e.json(http.MethodPost, base+"/environments", root, map[string]any{"name": "build-01", "kind": "host", "department_id": f.dept1,
		"url": url, "os": "linux", "deployment": "bare-metal", "agentd_token": token})
	wantStatus(t, "host env", r, http.StatusCreated)
	var env struct{ ID int64 }
	r.decode(t, &env)
	r = e.json(http.MethodPost, base+"/agents", root, map[string]any{"name": "coder", "department_id": f.dept1, "config": map[string]string{"model": "m"},
		"environment_ids": []int64{env.ID}})
	wantStatus(t, "agent", r, http.StatusCreated)
	var ag struct{ ID int64 }
	r.decode(t, &ag)
	// A member of the other department.
	otherID, other := e.newOrgUser(root, "acme", "other@acme.test")
	wantStatus(t, "other's role", e.json(http.MethodPost, base+"/roles", root,
		rbac.Assignment{Subject: fmt.Sprintf("user:%d", otherID), Role: rbac.RoleMember, Domain: rbac.DeptDomain(f.dept2)}), http.StatusNoContent)

	t.Run("create", func(t *testing.T) {
		// Auditors read sessions and their agents, but may not use them.
		for name, want := range map[string]int{"other": http.StatusNotFound, "plain": http.StatusNotFound, "auditor": http.StatusForbidden,
			"globex-admin": http.StatusUnauthorized} {
			tok := f.tokens[name]
			if name == "other" {
				tok = other
			}
			wantStatus(t, "create as "+name, e.json(http.MethodPost, base+"/sessions", tok, map[string]any{"agent_id": ag.ID}), want)
		}
		wantStatus(t, "unknown environment", e.json(http.MethodPost, base+"/sessions", f.tokens["member"],
			map[string]any{"agent_id": ag.ID, "environment_id": 999999}), http.StatusBadRequest)
	})
	newSession := func() int64 {
		r := e.json(http.MethodPost, base+"/sessions", f.tokens["member"], map[string]any{"agent_id": ag.ID})
		wantStatus(t, "member creates a session", r, http.StatusCreated)
		var s sessionOut
		r.decode(t, &s)
		if s.State != "pending" || s.AgentID != ag.ID {
			t.Fatalf("created %+v", s)
		}
		return s.ID
	}
	id := newSession()
	tokens := map[string]string{"other": other}
	for k, v := range f.tokens {
		tokens[k] = v
	}
	for k, v := range f.keys {
		tokens[k] = v
	}
	// Expected status per route and principal; the session is closed by
	// the last route, so order matters.
	routes := []struct {
		method, path string
		want         map[string]int
	}{
		{http.MethodGet, "/sessions/%d", map[string]int{"member": 200, "member-key": 200, "owner": 200, "admin": 200, "entered-admin": 200,
			"auditor": 200, "auditor-key": 200, "plain": 404, "other": 404, "globex-admin": 401, "globex-key": 401}},
		{http.MethodPost, "/sessions/%d/start", map[string]int{"member": 200, "member-key": 200, "owner": 200, "admin": 200, "entered-admin": 200,
			"auditor": 403, "auditor-key": 403, "plain": 404, "other": 404, "globex-admin": 401, "globex-key": 401}},
		// A host session has no sandbox to pause or resume: a conflict for
		// whoever may act, the usual refusal for the others.
		{http.MethodPost, "/sessions/%d/pause", map[string]int{"member": 409, "owner": 409, "admin": 409,
			"auditor": 403, "plain": 404, "other": 404, "globex-admin": 401}},
		{http.MethodPost, "/sessions/%d/resume", map[string]int{"member": 409, "owner": 409, "admin": 409,
			"auditor": 403, "plain": 404, "other": 404, "globex-admin": 401}},
		{http.MethodDelete, "/sessions/%d", map[string]int{"auditor": 403, "auditor-key": 403, "plain": 404, "other": 404,
			"globex-admin": 401, "globex-key": 401, "owner": 200, "member": 200}},
	}
	for _, rt := range routes {
		for name, want := range rt.want {
			t.Run(rt.method+" "+rt.path+" as "+name, func(t *testing.T) {
				path := base + fmt.Sprintf(rt.path, id)
				wantStatus(t, path, e.json(rt.method, path, tokens[name], nil), want)
			})
		}
	}
	t.Run("the started session has its workspace; closing keeps the record", func(t *testing.T) {
		r := e.json(http.MethodGet, fmt.Sprintf("%s/sessions/%d", base, id), f.tokens["member"], nil)
		var s sessionOut
		r.decode(t, &s)
		if s.State != "closed" || !strings.Contains(s.Workspace, fmt.Sprint(id)) {
			t.Errorf("after close: %+v", s)
		}
	})
	t.Run("lists show only what each may see", func(t *testing.T) {
		newSession()
		for name, want := range map[string]int{"member": 2, "owner": 2, "auditor": 2, "admin": 2, "plain": 0, "other": 0} {
			r := e.json(http.MethodGet, base+"/sessions?agent_id="+fmt.Sprint(ag.ID), tokens[name], nil)
			wantStatus(t, "list as "+name, r, http.StatusOK)
			var out struct{ Items []sessionOut }
			r.decode(t, &out)
			if len(out.Items) != want {
				t.Errorf("%s sees %d sessions, want %d", name, len(out.Items), want)
			}
		}
		wantStatus(t, "bad filter", e.json(http.MethodGet, base+"/sessions?state=reclaimed", f.tokens["member"], nil), http.StatusBadRequest)
		wantStatus(t, "bad time", e.json(http.MethodGet, base+"/sessions?created_after=yesterday", f.tokens["member"], nil), http.StatusBadRequest)
	})
	t.Run("another org's principals never see acme's sessions", func(t *testing.T) {
		wantStatus(t, "globex path", e.json(http.MethodGet, fmt.Sprintf("/api/v1/orgs/globex/sessions/%d", id), f.tokens["globex-admin"], nil), http.StatusNotFound)
	})
}
