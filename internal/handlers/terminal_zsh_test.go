package handlers_test

import (
	"fmt"
	"html"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
	"github.com/gatehouse/gatehouse/internal/terminal"
)

// jumpLineExit is a replay jump list entry with the exit code its shell
// reported (empty when none).
var jumpLineExit = regexp.MustCompile(`data-testid="jump-line"><code>([^<]*)</code></button>\s*(?:<span class="muted">exit ([^<]*)</span>)?`)

// TestTerminalZshIntegration: a browser terminal for a user whose login
// shell is zsh (SHELL=/…/zsh) runs zsh with the OSC 133 integration: the
// typed lines, builtins included, are the replay's jump list with their
// exit codes; the programs are the shell's direct children (audited as
// terminal.command); the user's own .zshenv, .zshrc (its alias works,
// its prompt shows) and .zlogin still run; and the private startup
// directory is gone from TMPDIR once the shell is up.
func TestTerminalZshIntegration(t *testing.T) {
	t.Parallel()
	zsh, err := exec.LookPath("zsh")
	if err != nil {
		t.Fatalf("zsh is required for this test (scripts/test installs it): %v", err)
	}
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		onAgentdProcess(t, f)
		home, tmp := t.TempDir(), t.TempDir()
		for name, body := range map[string]string{
			".zshenv": "export GH_TEST_ZSHENV=env-ran\n",
			".zshrc":  "alias greet=\"echo alias-from-$GH_TEST_ZSHENV\"\nPS1=\"zsh-user> \"\n",
			".zlogin": "export GH_TEST_ZLOGIN=login-ran\n",
		} {
			if err := os.WriteFile(filepath.Join(home, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": terminal.ShellCommand,
			"env": map[string]string{"SHELL": zsh, "HOME": home, "TMPDIR": tmp}, "tty": true, "stdin": true, "rows": 50, "cols": 250})
		wantStatus(t, "open the shell", r, http.StatusCreated)
		var o outputJSON
		r.decode(t, &o)
		sh := &interactiveShell{f: f, who: "member", id: o.CommandID}

		sh.awaitPrompt(t, 1)
		if left, err := os.ReadDir(tmp); err != nil || len(left) != 0 {
			t.Errorf("TMPDIR holds %v (%v) once the shell is up: the private startup directory was not removed", left, err)
		}
		typed := []string{
			"cd /tmp",
			"echo first-marker",
			"/bin/sleep 0.22", // a program that lives a moment, so agentd reads its arguments
			"greet",
			"false",
			"echo $GH_TEST_ZLOGIN-$ZSH_NAME",
		}
		// typeLines waits for each prompt again: the first is already read.
		sh.typeLines(t, typed...)
		out := sh.out.String()
		mustContain(t, "the user's startup files ran in zsh", out, "zsh-user> ", "alias-from-env-ran", "login-ran-zsh")

		t.Run("the jump list has the typed lines with exit codes", func(t *testing.T) {
			rp := f.e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/sessions/%d/commands/%d/replay", f.session, sh.id),
				cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["admin"]}}})
			wantStatus(t, "replay page", rp, http.StatusOK)
			var got []string
			for _, m := range jumpLineExit.FindAllStringSubmatch(string(rp.body), -1) {
				got = append(got, html.UnescapeString(m[1])+" => "+m[2])
			}
			want := []string{"cd /tmp => 0", "echo first-marker => 0", "/bin/sleep 0.22 => 0", "greet => 0", "false => 1",
				"echo $GH_TEST_ZLOGIN-$ZSH_NAME => 0", "exit => "}
			if !slices.Equal(got, want) {
				t.Errorf("jump list %q, want %q", got, want)
			}
		})
		t.Run("programs are the shell's direct children", func(t *testing.T) {
			_, programs := f.replayLists(t, sh.id)
			if !slices.Contains(programs, "$ /bin/sleep 0.22") {
				t.Errorf("programs list %q has no /bin/sleep 0.22", programs)
			}
			events := f.exportAudit(t, fmt.Sprintf("action:terminal.command target:%d", sh.id))
			var lines []string
			for _, e := range events {
				lines = append(lines, strings.Join(e.Details.Argv, " ")+" in "+e.Details.Cwd)
			}
			if !slices.Contains(lines, "/bin/sleep 0.22 in /tmp") {
				t.Errorf("terminal.command events %q, want /bin/sleep 0.22 in /tmp", lines)
			}
			// The integration runs builtins only: nothing of it is a program.
			for _, l := range lines {
				if !strings.HasPrefix(l, "/bin/sleep 0.22") {
					t.Errorf("unexpected terminal.command %q", l)
				}
			}
		})
	})
}
