package apidoc_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/gatehouse/gatehouse/internal/apidoc"
)

func operation(t *testing.T, doc *openapi3.T, id string) *openapi3.Operation {
	t.Helper()
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			if op.OperationID == id {
				return op
			}
		}
	}
	t.Fatalf("no operation %s", id)
	return nil
}

// The document declares what the server requires and says what it does
// (issue 35, item 7); the handler tests (TestOpenAPI* in
// internal/handlers) show the server refusing each missing input.
func TestDocumentSaysWhatTheServerDoes(t *testing.T) {
	doc, err := apidoc.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	requiredQuery := func(opID, name string) {
		t.Helper()
		p := operation(t, doc, opID).Parameters.GetByInAndName("query", name)
		if p == nil || !p.Required {
			t.Errorf("%s: query parameter %s is not declared required", opID, name)
		}
	}
	requiredQuery("deleteOrg", "confirm")
	requiredQuery("readFile", "path")

	fetch := operation(t, doc, "fetchFile")
	body := fetch.RequestBody.Value.Content.Get("application/json").Schema.Value
	for _, f := range []string{"url", "path"} {
		if !slices.Contains(body.Required, f) {
			t.Errorf("fetchFile: body field %s is not required", f)
		}
	}
	if strings.Contains(fetch.Summary+fetch.Description, "public addresses only") {
		t.Error("fetchFile claims a restriction to public addresses; the first URL is fetched wherever it points")
	}
	if strings.Contains(body.Properties["sha256"].Value.Description, "422") {
		t.Error("fetchFile: a checksum mismatch is answered 400, not 422")
	}

	for _, opID := range []string{"createEnvironment", "updateEnvironment"} {
		kind := operation(t, doc, opID).RequestBody.Value.Content.Get("application/json").Schema.Value.Properties["kind"].Value
		if got := kind.Enum; !slices.Equal(got, []any{"host", "sandbox"}) {
			t.Errorf("%s: kind enum %v, want host and sandbox", opID, got)
		}
	}

	// Removals name what they remove in the query or in an optional body.
	for opID, fields := range map[string][]string{
		"removePolicy": {"subject", "domain", "object", "action", "effect"},
		"unassignRole": {"subject", "role", "domain"},
	} {
		op := operation(t, doc, opID)
		if op.RequestBody == nil || op.RequestBody.Value.Required {
			t.Errorf("%s: the body is not optional", opID)
		}
		for _, f := range fields {
			if op.Parameters.GetByInAndName("query", f) == nil {
				t.Errorf("%s: query parameter %s is not declared", opID, f)
			}
		}
	}
}
