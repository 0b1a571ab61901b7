package e2b

import (
	"errors"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/envs"
)

// TestTemplateName: a key's sandboxes run its agent's template, asked for
// by name, by backend id, as "base" or not at all; any other name is
// refused, never silently replaced.
func TestTemplateName(t *testing.T) {
	t.Parallel()
	ag := agents.Agent{Name: "coder"}
	tpl := &envs.Template{Name: "python", BackendTemplateID: "tpl-123"}
	for _, c := range []struct {
		name  string
		tpl   *envs.Template
		asked string
		want  string // "" means refused
	}{
		{"by name", tpl, "python", "python"},
		{"by backend id", tpl, "tpl-123", "python"},
		{"the SDK's default", tpl, "base", "python"},
		{"none asked", tpl, "", "python"},
		{"by the agent's name", tpl, "coder", "python"},
		{"another template", tpl, "ubuntu-gpu", ""},
		{"an agent without a template", nil, "base", "coder"},
		{"an agent without a template, another name", nil, "python", ""},
	} {
		got, err := templateName(ag, c.tpl, c.asked)
		var ve *apperr.ValidationError
		switch {
		case c.want == "" && !errors.As(err, &ve):
			t.Errorf("%s: %q, %v; want a refusal naming templateID", c.name, got, err)
		case c.want == "" && ve.Fields["templateID"] == "":
			t.Errorf("%s: refusal %v names no templateID", c.name, ve)
		case c.want != "" && (err != nil || got != c.want):
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}

// TestSizeOf: a template's size, with E2B's minimums where it names none.
func TestSizeOf(t *testing.T) {
	t.Parallel()
	if got := sizeOf(nil); got != (templateSize{cpu: 1, memory: 512}) {
		t.Errorf("no template: %+v", got)
	}
	if got := sizeOf(&envs.Template{VCPU: 4, MemoryMB: 2048, WritableLayerMB: 10240}); got != (templateSize{cpu: 4, memory: 2048, disk: 10240}) {
		t.Errorf("a sized template: %+v", got)
	}
	if got := sizeOf(&envs.Template{MemoryMB: 64}); got != (templateSize{cpu: 1, memory: 512}) {
		t.Errorf("below E2B's minimums: %+v", got)
	}
}

// TestMetadataFilter decodes the filter as the JS SDK builds it: each key
// and value encodeURIComponent-ed, the pairs URLSearchParams-encoded (the
// query string's own encoding already undone).
func TestMetadataFilter(t *testing.T) {
	t.Parallel()
	got, err := metadataFilter("user=alice%2520b%2526c%253Dd")
	if err != nil || len(got) != 1 || got["user"] != "alice b&c=d" {
		t.Fatalf("got %v, %v", got, err)
	}
	if got, err := metadataFilter(""); got != nil || err != nil {
		t.Errorf("empty: %v, %v", got, err)
	}
	for _, bad := range []string{"a=%zz", "a=1&a=2"} {
		if _, err := metadataFilter(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

// TestTimeoutSeconds: E2B's default when none is sent (unless one is
// required), and 1 s to a day otherwise.
func TestTimeoutSeconds(t *testing.T) {
	t.Parallel()
	n := func(v int) *int { return &v }
	for _, c := range []struct {
		in       *int
		required bool
		want     int // 0 means refused
	}{
		{nil, false, defaultTimeout}, {nil, true, 0}, {n(1), true, 1}, {n(86400), false, 86400}, {n(0), false, 0}, {n(86401), false, 0},
	} {
		got, err := timeoutSeconds(c.in, c.required)
		if c.want == 0 && err == nil || c.want != 0 && (err != nil || got != c.want) {
			t.Errorf("timeoutSeconds(%v, %v) = %d, %v; want %d", c.in, c.required, got, err, c.want)
		}
	}
}
