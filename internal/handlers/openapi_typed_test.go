package handlers_test

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// The endpoints whose OpenAPI types were once free-form objects (issue 26,
// item 21) answer what the document now types, checked by the validator
// every handler test runs behind: PUT /sso (and its refusal of an unknown
// field), GET /sso with typed mappings, POST /sso/test's report, and a
// recording as JSON with its "events".
func TestOpenAPITypedSSOAndRecording(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)

		t.Run("sso settings", func(t *testing.T) {
			update := map[string]any{"provider_name": "Acme login", "issuer_url": "http://127.0.0.1:1/realms/acme", "client_id": "gatehouse",
				"client_secret": "s3cret-value", "scopes": []string{"openid", "email", "groups"}, "allowed_domains": []string{"acme.test"},
				"mappings": []map[string]any{{"group": "auditors", "role": rbac.RoleAuditor}, {"group": "devs", "role": rbac.RoleMember, "department_id": f.dept1}},
				"enabled":  false}
			r := f.call(http.MethodPut, "/sso", "admin", update)
			wantStatus(t, "put sso", r, http.StatusOK)
			var v struct {
				ClientSecretSet bool `json:"client_secret_set"`
				Mappings        []struct {
					Group        string `json:"group"`
					Role         string `json:"role"`
					DepartmentID int64  `json:"department_id"`
				} `json:"mappings"`
			}
			r.decode(t, &v)
			if !v.ClientSecretSet || len(v.Mappings) != 2 || v.Mappings[1].DepartmentID != f.dept1 {
				t.Fatalf("saved settings: %s", r.body)
			}
			if strings.Contains(string(r.body), "s3cret-value") {
				t.Fatalf("the answer carries the client secret: %s", r.body)
			}
			wantStatus(t, "get sso", f.call(http.MethodGet, "/sso", "admin", nil), http.StatusOK)

			update["client_secrett"] = "typo"
			r = f.call(http.MethodPut, "/sso", "admin", update)
			wantStatus(t, "put sso with an unknown field", r, http.StatusBadRequest)
			mustContain(t, "unknown field refusal", string(r.body), "client_secrett")

			r = f.call(http.MethodPost, "/sso/test", "admin", nil)
			wantStatus(t, "test sso", r, http.StatusOK)
			var rep struct {
				OK       bool     `json:"ok"`
				Problems []string `json:"problems"`
			}
			r.decode(t, &rep)
			if rep.OK || len(rep.Problems) == 0 {
				t.Fatalf("an unreachable issuer tested fine: %s", r.body)
			}
		})

		t.Run("recording as json", func(t *testing.T) {
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo typed", "wait_ms": 5000})
			wantStatus(t, "exec", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			waitFollowersIdle(t, f.e)
			r = f.call(http.MethodGet, f.sessionPath("/commands/%d/recording?format=json", o.CommandID), "member", nil)
			wantStatus(t, "recording as json", r, http.StatusOK)
			var rec struct {
				Command struct {
					ID int64 `json:"id"`
				} `json:"command"`
				Events []struct {
					Stream string `json:"stream"`
					Data   []byte `json:"data"`
				} `json:"events"`
			}
			r.decode(t, &rec)
			var out string
			for _, ev := range rec.Events {
				if ev.Stream == "stdout" || ev.Stream == "stderr" || ev.Stream == "pty" {
					out += string(ev.Data) // not agentd's exec records
				}
			}
			if rec.Command.ID != o.CommandID || out != "typed\n" {
				t.Fatalf("recording %s (output %q)", r.body, out)
			}
			if !strings.Contains(string(r.body), base64.StdEncoding.EncodeToString([]byte("typed\n"))) {
				t.Fatalf("output not base64 in %s", r.body)
			}
		})
	})
}
