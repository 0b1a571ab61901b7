package agents_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
)

// TestAddAndRemoveSkill: a skill is added to and removed from a stored
// configuration with its other fields kept; a bad skill is refused on
// its own field, as the agent page shows it.
func TestAddAndRemoveSkill(t *testing.T) {
	t.Parallel()
	const stored = `{"model":"m","system_prompt":"be brief","skills":[{"name":"fmt","source":"/opt/fmt"}]}`
	pin := strings.Repeat("0f", 32)
	got, err := agents.AddSkill(stored, agents.Skill{Name: "tools", Source: "upload:tools", SHA256: strings.ToUpper(pin)})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","system_prompt":"be brief","skills":[{"name":"fmt","source":"/opt/fmt"},{"name":"tools","source":"upload:tools","sha256":"` + pin + `"}]}`
	if got != want {
		t.Fatalf("added:\n got %s\nwant %s", got, want)
	}
	if got, err = agents.RemoveSkill(got, "fmt"); err != nil {
		t.Fatal(err)
	}
	if want := `{"model":"m","system_prompt":"be brief","skills":[{"name":"tools","source":"upload:tools","sha256":"` + pin + `"}]}`; got != want {
		t.Fatalf("removed:\n got %s\nwant %s", got, want)
	}
	for _, tc := range []struct {
		skill agents.Skill
		field string
	}{
		{agents.Skill{Name: "Fmt", Source: "/x"}, "name"},
		{agents.Skill{Name: "fmt", Source: "/x"}, "name"},
		{agents.Skill{Name: "new", Source: "ftp://x"}, "source"},
		{agents.Skill{Name: "new", Source: "/a/../b"}, "source"},
		{agents.Skill{Name: "new", Source: "https://x/y", SHA256: "abc"}, "sha256"},
		{agents.Skill{Name: "new", Source: "/opt/new", SHA256: pin}, "sha256"},
	} {
		_, err := agents.AddSkill(stored, tc.skill)
		var ve *apperr.ValidationError
		if !errors.As(err, &ve) || ve.Fields[tc.field] == "" {
			t.Errorf("%+v: got %v, want a problem with %s", tc.skill, err, tc.field)
		}
	}
	var ve *apperr.ValidationError
	if _, err := agents.RemoveSkill(stored, "nope"); !errors.As(err, &ve) || ve.Fields["name"] == "" {
		t.Errorf("removing a skill the agent lacks: %v", err)
	}
}
