package handlers_test

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net/http"
	"testing"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestPageUploadFormCSRF: the agent page's upload form, as a browser
// sends it (the _csrf field first), stores the file for the department's
// owner; the same form with the field missing is refused and stores
// nothing.
func TestPageUploadFormCSRF(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e := f.e
		r := e.json(http.MethodPost, "/api/v1/orgs/acme/environments", f.tokens["entered-admin"], map[string]any{"name": "build", "kind": "host",
			"department_id": f.dept1, "url": "http://127.0.0.1:1", "os": "linux", "deployment": "bare-metal", "agentd_token": "0123456789abcdef0123"})
		wantStatus(t, "create environment", r, http.StatusCreated)
		var env struct{ ID int64 }
		r.decode(t, &env)
		r = e.json(http.MethodPost, "/api/v1/orgs/acme/agents", f.tokens["entered-admin"], map[string]any{"name": "coder",
			"department_id": f.dept1, "config": map[string]string{"model": "m"}, "environment_ids": []int64{env.ID}})
		wantStatus(t, "create agent", r, http.StatusCreated)
		var ag struct{ ID int64 }
		r.decode(t, &ag)
		const csrf = "page-csrf-token-0123456789"
		cookies := []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["owner"]}, {Name: "gh_csrf", Value: csrf}}
		post := func(name string, fields ...[2]string) response {
			var body bytes.Buffer
			mw := multipart.NewWriter(&body)
			for _, fl := range fields {
				if fl[0] == "file" {
					w, _ := mw.CreateFormFile("file", "brief.md")
					_, _ = w.Write([]byte(fl[1]))
					continue
				}
				_ = mw.WriteField(fl[0], fl[1])
			}
			_ = mw.Close()
			return e.do(request{method: http.MethodPost, path: fmt.Sprintf("/o/acme/agents/%d/uploads", ag.ID), body: &body,
				contentType: mw.FormDataContentType(), cookies: cookies})
		}
		listed := func(name string) bool {
			r := e.do(request{method: http.MethodGet, path: fmt.Sprintf("/api/v1/orgs/acme/agents/%d/uploads", ag.ID), token: f.tokens["owner"]})
			wantStatus(t, "list uploads", r, http.StatusOK)
			return bytes.Contains(r.body, []byte(`"`+name+`"`))
		}
		r = post("forged", [2]string{"kind", "file"}, [2]string{"name", "forged.md"}, [2]string{"file", "forged\n"})
		wantStatus(t, "a form without _csrf", r, http.StatusForbidden)
		if listed("forged.md") {
			t.Fatal("a form without _csrf stored its file")
		}
		r = post("brief", [2]string{"_csrf", csrf}, [2]string{"kind", "file"}, [2]string{"name", "brief.md"}, [2]string{"file", "the brief\n"})
		wantStatus(t, "the page's form", r, http.StatusSeeOther)
		if !listed("brief.md") {
			t.Fatal("the page's form did not store its file")
		}
	})
}
