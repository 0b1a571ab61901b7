package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// requestApproval stores a request in acme through the service, as the
// gateway will: by a key of user requester, for an agent of dept.
func requestApproval(t *testing.T, f *orgFixture, requester int64, dept int64, cmd string) approvals.Approval {
	t.Helper()
	ten, err := f.e.c.Tenants.Open(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	defer ten.Release()
	svc := &approvals.Service{DB: ten.DB, Audit: ten.Audit, Org: "acme", Notifier: f.e.c.Server.ApprovalNotifier}
	a, err := svc.Request(context.Background(), approvals.Binding{SessionID: 1, AgentID: 1, DepartmentID: &dept,
		Requester: approvals.Requester{Type: audit.ActorAPIKey, ID: fmt.Sprint(1000 + requester), Name: "agent key", UserID: requester},
		Command:   cmd, Program: strings.Fields(cmd)[0], Args: strings.Fields(cmd)[1:], Env: map[string]string{"TOKEN": "never-shown-value"},
		Rule: "ask git push *"})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestApprovalsAPI: who sees, decides and cancels requests through the
// API, each answer validated against the OpenAPI document, on both
// dialects.
func TestApprovalsAPI(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e := f.e
		base := "/api/v1/orgs/acme/approvals"
		a := requestApproval(t, f, f.ids["member"], f.dept1, "git push origin main")
		id := fmt.Sprint(a.ID)

		t.Run("who sees it", func(t *testing.T) {
			for name, want := range map[string]int{"owner": 1, "admin": 1, "auditor": 1, "member": 1, "plain": 0, "auditor-key": 1} {
				tok := f.tokens[name]
				if tok == "" {
					tok = f.keys[name]
				}
				r := e.json(http.MethodGet, base+"?state=pending", tok, nil)
				wantStatus(t, "list as "+name, r, http.StatusOK)
				var out struct{ Items []struct{ ID int64 } }
				r.decode(t, &out)
				if len(out.Items) != want {
					t.Errorf("%s lists %d pending, want %d", name, len(out.Items), want)
				}
				wantGet := http.StatusOK
				if want == 0 {
					wantGet = http.StatusNotFound
				}
				wantStatus(t, "get as "+name, e.json(http.MethodGet, base+"/"+id, tok, nil), wantGet)
			}
			r := e.json(http.MethodGet, base+"/"+id, f.tokens["owner"], nil)
			if strings.Contains(string(r.body), "never-shown-value") || !strings.Contains(string(r.body), `"TOKEN"`) {
				t.Fatalf("answer shows the env value or hides its name: %s", r.body)
			}
			wantStatus(t, "unknown id", e.json(http.MethodGet, base+"/999999", f.tokens["admin"], nil), http.StatusNotFound)
			wantStatus(t, "bad state", e.json(http.MethodGet, base+"?state=weird", f.tokens["admin"], nil), http.StatusBadRequest)
		})

		t.Run("who decides", func(t *testing.T) {
			approve := map[string]string{"decision": "approve", "scope": "once", "reason": "ok"}
			wantStatus(t, "member decides", e.json(http.MethodPost, base+"/"+id+"/decision", f.tokens["member"], approve), http.StatusForbidden)
			wantStatus(t, "auditor decides", e.json(http.MethodPost, base+"/"+id+"/decision", f.tokens["auditor"], approve), http.StatusForbidden)
			wantStatus(t, "plain decides", e.json(http.MethodPost, base+"/"+id+"/decision", f.tokens["plain"], approve), http.StatusNotFound)
			r := e.json(http.MethodPost, base+"/"+id+"/decision", f.tokens["owner"], map[string]string{"decision": "maybe"})
			wantStatus(t, "bad decision", r, http.StatusBadRequest)
			if !strings.Contains(string(r.body), `"decision"`) {
				t.Fatalf("no field error: %s", r.body)
			}
			r = e.json(http.MethodPost, base+"/"+id+"/decision", f.tokens["owner"], map[string]string{"decision": "approve", "scope": "rule"})
			// The rule scope adds a rule to the request's agent, which this
			// made-up request does not have: nothing is decided
			// (TestExecApproval covers the rule scope on a real agent).
			wantStatus(t, "rule scope without its agent", r, http.StatusNotFound)
			if !strings.Contains(string(r.body), "agent_not_found") {
				t.Fatalf("rule scope: %s", r.body)
			}
			r = e.json(http.MethodPost, base+"/"+id+"/decision", f.tokens["owner"], approve)
			wantStatus(t, "owner approves", r, http.StatusOK)
			var got struct {
				State   string
				Decider struct{ ID string }
			}
			r.decode(t, &got)
			if got.State != "approved" || got.Decider.ID != fmt.Sprint(f.ids["owner"]) {
				t.Fatalf("approved: %s", r.body)
			}
			r = e.json(http.MethodPost, base+"/"+id+"/decision", f.tokens["admin"], map[string]string{"decision": "deny"})
			wantStatus(t, "second decision", r, http.StatusConflict)
			if !strings.Contains(string(r.body), "approval_decided") {
				t.Fatalf("second decision: %s", r.body)
			}
		})

		t.Run("nobody decides their own request", func(t *testing.T) {
			own := requestApproval(t, f, f.ids["owner"], f.dept1, "kubectl apply -f x")
			r := e.json(http.MethodPost, fmt.Sprintf("%s/%d/decision", base, own.ID), f.tokens["owner"], map[string]string{"decision": "approve"})
			wantStatus(t, "self decision", r, http.StatusForbidden)
			if !strings.Contains(string(r.body), "nobody decides their own request") {
				t.Fatalf("403 does not name the rule: %s", r.body)
			}
			wantStatus(t, "cancel by another", e.json(http.MethodPost, fmt.Sprintf("%s/%d/cancel", base, own.ID), f.tokens["admin"], nil), http.StatusForbidden)
			r = e.json(http.MethodPost, fmt.Sprintf("%s/%d/cancel", base, own.ID), f.tokens["owner"], nil)
			wantStatus(t, "cancel by its requester", r, http.StatusOK)
			if !strings.Contains(string(r.body), `"cancelled"`) {
				t.Fatalf("cancel: %s", r.body)
			}
			wantStatus(t, "cancel twice", e.json(http.MethodPost, fmt.Sprintf("%s/%d/cancel", base, own.ID), f.tokens["owner"], nil), http.StatusConflict)
		})

		t.Run("page", func(t *testing.T) {
			p := requestApproval(t, f, f.ids["member"], f.dept1, "terraform apply")
			csrf := "approvals-csrf-token-0123456789"
			cookies := []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["owner"]}, {Name: "gh_csrf", Value: csrf}}
			r := e.do(request{method: http.MethodGet, path: "/o/acme/approvals", cookies: cookies})
			wantStatus(t, "page", r, http.StatusOK)
			for _, want := range []string{fmt.Sprintf(`data-testid="approval-row-%d"`, p.ID), `data-testid="nav-approvals-count"`, "terraform apply", fmt.Sprintf(`data-testid="approval-approve-%d"`, p.ID)} {
				if !strings.Contains(string(r.body), want) {
					t.Errorf("page lacks %s", want)
				}
			}
			form := url.Values{"decision": {"deny"}, "scope": {"once"}, "reason": {"not today"}}
			r = e.do(request{method: http.MethodPost, path: fmt.Sprintf("/o/acme/approvals/%d/decision", p.ID), cookies: cookies,
				header: http.Header{"X-Csrf-Token": {csrf}}, body: strings.NewReader(form.Encode()), contentType: "application/x-www-form-urlencoded"})
			wantStatus(t, "deny form", r, http.StatusSeeOther)
			r = e.json(http.MethodGet, fmt.Sprintf("%s/%d", base, p.ID), f.tokens["owner"], nil)
			if !strings.Contains(string(r.body), `"denied"`) || !strings.Contains(string(r.body), "not today") {
				t.Fatalf("after the form: %s", r.body)
			}
			// The member may not decide: no count in its navigation.
			mc := []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["member"]}}
			r = e.do(request{method: http.MethodGet, path: "/o/acme/approvals", cookies: mc})
			wantStatus(t, "member's page", r, http.StatusOK)
			if strings.Contains(string(r.body), `nav-approvals-count`) {
				t.Fatal("a member who may not decide sees the count")
			}
		})

		t.Run("webhook settings", func(t *testing.T) {
			hook := base + "/webhook"
			wantStatus(t, "owner reads the webhook", e.json(http.MethodGet, hook, f.tokens["owner"], nil), http.StatusForbidden)
			r := e.json(http.MethodPut, hook, f.tokens["admin"], map[string]string{"url": "https://chat.example.com/hook", "secret": "short"})
			wantStatus(t, "short secret", r, http.StatusBadRequest)
			r = e.json(http.MethodPut, hook, f.tokens["admin"], map[string]string{"url": "https://chat.example.com/hook", "secret": "a-webhook-secret-of-length"})
			wantStatus(t, "set", r, http.StatusOK)
			r = e.json(http.MethodGet, hook, f.tokens["admin"], nil)
			wantStatus(t, "get", r, http.StatusOK)
			if !strings.Contains(string(r.body), `"secret_set":true`) || strings.Contains(string(r.body), "a-webhook-secret-of-length") {
				t.Fatalf("webhook answer: %s", r.body)
			}
		})
	})
}
