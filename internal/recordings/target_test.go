package recordings_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gatehouse/gatehouse/internal/recordings"
)

// TestTargetNameCutOnACharacter: a command's audit target names the
// command cut to its budget on a character, never inside one (the audit
// row would be refused by Postgres).
func TestTargetNameCutOnACharacter(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{strings.Repeat("é", 150), "echo " + strings.Repeat("日", 100), strings.Repeat("🙂", 80)} {
		name := recordings.Command{ID: 1, Command: cmd}.Target().Name
		if !utf8.ValidString(name) || !strings.HasSuffix(name, "…") || len(name) > 203 {
			t.Errorf("target name %q (%d bytes) for a %d-byte command", name, len(name), len(cmd))
		}
	}
}
