package handlers_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestAddUserPicksTheRole is issue 41 item 9 through the page handlers:
// the add-user form gives the role it names (with its department), audited
// as user.create and role.assign; a form without a role, or a department
// role without a department, is refused with what to choose and creates
// nothing; the user page's role form assumes nothing either.
func TestAddUserPicksTheRole(t *testing.T) {
	t.Parallel()
	f := newOrgFixture(t, store.SQLite)
	e, tok := f.e, f.tokens["admin"]
	dept := rbac.DeptDomain(f.dept1)
	exists := func(email string) bool {
		r := e.json(http.MethodGet, "/api/v1/orgs/acme/users?limit=200", tok, nil)
		return strings.Contains(string(r.body), `"`+email+`"`)
	}
	add := func(form url.Values) response {
		return e.do(pageAs(http.MethodPost, "/o/acme/users", tok, form.Encode()))
	}

	for _, tc := range []struct {
		name, role, domain, field, says string
	}{
		{"no role chosen", "", "", "role", "Choose a role for the new user"},
		{"a department role without a department", rbac.RoleMember, "", "domain", "Choose the department"},
		{"a department that does not exist", rbac.RoleDeptOwner, "dept:999999", "domain", "does not exist"},
		{"an unknown role", "root", "", "role", "Unknown role"},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			email := strings.ReplaceAll(tc.name, " ", "-") + "@acme.test"
			r := add(url.Values{"email": {email}, "name": {"X"}, "role": {tc.role}, "domain": {tc.domain}})
			wantStatus(t, "add", r, http.StatusBadRequest)
			body := string(r.body)
			if !strings.Contains(body, `data-testid="`+tc.field+`-error"`) || !strings.Contains(body, tc.says) {
				t.Errorf("the refusal does not say %q at %s", tc.says, tc.field)
			}
			if !strings.Contains(body, `value="`+email+`"`) {
				t.Error("the refused form lost the email")
			}
			if exists(email) {
				t.Errorf("a refused form created %s", email)
			}
		})
	}

	t.Run("a member of a department, created and assigned together", func(t *testing.T) {
		r := add(url.Values{"email": {"new.member@acme.test"}, "name": {"New"}, "role": {rbac.RoleMember}, "domain": {dept}})
		wantStatus(t, "add", r, http.StatusSeeOther)
		loc := r.header.Get("Location")
		id := loc[strings.LastIndex(loc, "/")+1:]
		var roles struct{ Assignments []rbac.Assignment }
		e.json(http.MethodGet, "/api/v1/orgs/acme/roles?subject=user:"+id, tok, nil).decode(t, &roles)
		if len(roles.Assignments) != 1 || roles.Assignments[0].Role != rbac.RoleMember || roles.Assignments[0].Domain != dept {
			t.Errorf("the new user holds %+v, want member in %s", roles.Assignments, dept)
		}
		for _, action := range []string{"user.create", "role.assign"} {
			var out struct {
				Items []struct {
					Target  struct{ ID string } `json:"target"`
					Details json.RawMessage     `json:"details"`
				} `json:"items"`
			}
			e.json(http.MethodGet, "/api/v1/orgs/acme/audit?q=action:"+action, tok, nil).decode(t, &out)
			if len(out.Items) == 0 || !strings.Contains(fmt.Sprint(out.Items[0].Target.ID)+string(out.Items[0].Details), id) {
				t.Errorf("no %s event for user %s: %+v", action, id, out.Items)
			}
		}
	})

	t.Run("an auditor needs no department; No role yet gives none", func(t *testing.T) {
		for _, tc := range []struct{ email, role string }{{"aud@acme.test", rbac.RoleAuditor}, {"none@acme.test", "none"}} {
			r := add(url.Values{"email": {tc.email}, "role": {tc.role}, "domain": {dept}})
			wantStatus(t, "add "+tc.email, r, http.StatusSeeOther)
			loc := r.header.Get("Location")
			var roles struct{ Assignments []rbac.Assignment }
			e.json(http.MethodGet, "/api/v1/orgs/acme/roles?subject=user:"+loc[strings.LastIndex(loc, "/")+1:], tok, nil).decode(t, &roles)
			want := "[]"
			if tc.role == rbac.RoleAuditor {
				want = "[{auditor org}]"
			}
			got := "["
			for i, a := range roles.Assignments {
				if i > 0 {
					got += " "
				}
				got += "{" + a.Role + " " + a.Domain + "}"
			}
			if got += "]"; got != want {
				t.Errorf("%s holds %s, want %s", tc.email, got, want)
			}
		}
	})

	t.Run("the user page's role form preselects nothing and refuses no choice", func(t *testing.T) {
		page := fmt.Sprintf("/o/acme/users/%d", f.targetUser)
		r := e.do(pageAs(http.MethodGet, page, tok, ""))
		wantStatus(t, "user page", r, http.StatusOK)
		if !strings.Contains(string(r.body), `<option value="" selected>Choose a role…</option>`) {
			t.Error("the role form does not start at \"Choose a role…\"")
		}
		r = e.do(pageAs(http.MethodPost, page+"/roles", tok, "role=&domain="))
		wantStatus(t, "assign nothing", r, http.StatusBadRequest)
		if !strings.Contains(string(r.body), "Choose a role to give.") {
			t.Error("assigning without a role does not say to choose one")
		}
		wantStatus(t, "member without a department", e.do(pageAs(http.MethodPost, page+"/roles", tok, "role=member&domain=")), http.StatusBadRequest)
		wantStatus(t, "member of Research", e.do(pageAs(http.MethodPost, page+"/roles", tok, "role=member&domain="+url.QueryEscape(dept))), http.StatusSeeOther)
	})
}
