package apidoc

import (
	"context"
	"encoding/json"
	"testing"
)

// The embedded document parses and validates as OpenAPI 3.1, and its JSON
// rendering parses back to the same paths.
func TestDocumentValid(t *testing.T) {
	doc, err := Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi %q, want 3.1", doc.OpenAPI)
	}
	var s Served
	b, err := s.JSON(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.OpenAPI != "3.1.0" || len(back.Paths) != doc.Paths.Len() {
		t.Fatalf("json rendering: openapi %q, %d paths, want 3.1.0 and %d", back.OpenAPI, len(back.Paths), doc.Paths.Len())
	}
}
