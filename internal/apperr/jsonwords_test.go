package apperr_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// TestDescribeJSON checks that decode failures are told in people's words:
// never a Go type name, always what was expected.
func TestDescribeJSON(t *testing.T) {
	t.Parallel()
	type skill struct {
		Name string `json:"name"`
	}
	type config struct {
		Model  string  `json:"model"`
		Skills []skill `json:"skills"`
		Limit  int     `json:"limit"`
	}
	cases := []struct {
		name, doc string
		want      []string
	}{
		{"string instead of object", `"claude"`, []string{"The configuration must be an object in { }, not text."}},
		{"number instead of text", `{"model": 4}`, []string{`"model"`, "text in quotes", "not a number"}},
		{"object instead of list", `{"skills": {}}`, []string{`"skills"`, "a list in [ ]"}},
		{"text instead of number", `{"limit": "x"}`, []string{`"limit"`, "a whole number"}},
		{"syntax", `{"model": }`, []string{"not valid JSON", "near character"}},
		{"unknown field", `{"modle": "x"}`, []string{`unknown field "modle"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dec := json.NewDecoder(strings.NewReader(tc.doc))
			dec.DisallowUnknownFields()
			var c config
			err := dec.Decode(&c)
			if err == nil {
				t.Fatalf("decoding %s succeeded", tc.doc)
			}
			got := apperr.DescribeJSON("The configuration", err)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q does not say %q", got, w)
				}
			}
			for _, bad := range []string{"Go value", "apperr_test", "unmarshal", "struct"} {
				if strings.Contains(got, bad) {
					t.Errorf("%q shows an internal detail %q", got, bad)
				}
			}
		})
	}
}
