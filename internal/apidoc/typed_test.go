package apidoc_test

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/gatehouse/gatehouse/internal/apidoc"
	"github.com/gatehouse/gatehouse/internal/sso"
)

// jsonFields are the JSON names of t's fields.
func jsonFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

func props(s *openapi3.Schema) []string {
	var out []string
	for k := range s.Properties {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The SSO schemas are the Go types the handlers decode and answer, field
// for field, closed to other fields (issue 26, item 21): a field added to
// the type and not to the document fails here.
func TestSSOSchemasMatchTheGoTypes(t *testing.T) {
	doc, err := apidoc.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	schemas := doc.Components.Schemas
	keys := schemas["SSOReport"].Value.Properties["keys"].Value.Items.Value
	for _, tc := range []struct {
		name   string
		schema *openapi3.Schema
		goType reflect.Type
		closed bool
	}{
		{"PUT /sso body", schemas["SSOUpdate"].Value, reflect.TypeFor[sso.Update](), true},
		{"SSO mapping", schemas["SSOMapping"].Value, reflect.TypeFor[sso.Mapping](), true},
		{"POST /sso/test answer", schemas["SSOReport"].Value, reflect.TypeFor[sso.Report](), true},
		{"a key in the test answer", keys, reflect.TypeFor[sso.Key](), true},
		{"GET /sso answer", doc.Components.Responses["SSO"].Value.Content.Get("application/json").Schema.Value, reflect.TypeFor[sso.View](), false},
	} {
		if got, want := props(tc.schema), jsonFields(tc.goType); !slices.Equal(got, want) {
			t.Errorf("%s: the document has fields %q, the Go type %s %q", tc.name, got, tc.goType, want)
		}
		if tc.closed && (tc.schema.AdditionalProperties.Has == nil || *tc.schema.AdditionalProperties.Has) {
			t.Errorf("%s: other fields are not refused (additionalProperties: false)", tc.name)
		}
	}
}

// The request schema refuses what the server refuses: an unknown field, a
// wrongly typed one, a mapping without a role; and takes a real update.
func TestSSOUpdateSchemaRefusesWhatTheServerRefuses(t *testing.T) {
	doc, err := apidoc.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := doc.Components.Schemas["SSOUpdate"].Value
	secret := "s3cret"
	good, err := json.Marshal(sso.Update{IssuerURL: "https://login.example.com", ClientID: "gatehouse", ClientSecret: &secret,
		Scopes: []string{"openid", "email"}, Mappings: []sso.Mapping{{Group: "devs", Role: "member", DepartmentID: 2}}, Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		body string
		ok   bool
	}{
		{"a real update", string(good), true},
		{"nulls where Go takes them", `{"issuer_url":"https://x.example","client_id":"c","client_secret":null,"scopes":null,"mappings":null}`, true},
		{"unknown field", `{"issuer_url":"https://x.example","client_id":"c","client_secrets":"x"}`, false},
		{"enabled as a string", `{"issuer_url":"https://x.example","client_id":"c","enabled":"yes"}`, false},
		{"mapping without a role", `{"issuer_url":"https://x.example","client_id":"c","mappings":[{"group":"devs"}]}`, false},
		{"mapping with an unknown role", `{"issuer_url":"https://x.example","client_id":"c","mappings":[{"group":"devs","role":"root"}]}`, false},
		{"mapping with an extra field", `{"issuer_url":"https://x.example","client_id":"c","mappings":[{"group":"devs","role":"auditor","dept":1}]}`, false},
	} {
		var v any
		if err := json.Unmarshal([]byte(tc.body), &v); err != nil {
			t.Fatal(err)
		}
		err := s.VisitJSON(v, openapi3.EnableJSONSchema2020())
		if (err == nil) != tc.ok {
			t.Errorf("%s: validation error %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	// The JSON recording's events are under "events", as the handler writes.
	rec := doc.Components.Schemas["Recording"].Value
	started := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Format(time.RFC3339)
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"command":{"id":1,"session_id":1,"command":"echo hi","cwd":"","tty":false,"started_by":"a","started_at":"` + started + `","ended_at":null,"state":"running","exit_code":null,"duration_ms":null,"output_bytes":3,"input_bytes":0,"dropped_bytes":0,"truncated":false},"events":[{"t":0.1,"seq":1,"stream":"stdout","data":"aGkK"}]}`, true},
		{`{"command":{"id":1,"session_id":1,"command":"echo hi","cwd":"","tty":false,"started_by":"a","started_at":"` + started + `","ended_at":null,"state":"running","exit_code":null,"duration_ms":null,"output_bytes":3,"input_bytes":0,"dropped_bytes":0,"truncated":false},"chunks":[{"t":0.1,"seq":1,"stream":"stdout","data":"aGkK"}]}`, false},
	} {
		var v any
		if err := json.Unmarshal([]byte(tc.body), &v); err != nil {
			t.Fatal(err)
		}
		if err := rec.VisitJSON(v, openapi3.EnableJSONSchema2020()); (err == nil) != tc.ok {
			t.Errorf("recording %s: validation error %v, want ok %v", tc.body[len(tc.body)-60:], err, tc.ok)
		}
	}
}
