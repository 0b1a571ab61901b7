package handlers_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
	"github.com/gatehouse/gatehouse/internal/terminal"
)

// shellMarks counts the prompts (OSC 133 B marks) a terminal printed.
var promptMark = []byte("\x1b]133;B\x07")

// interactiveShell is a browser terminal's shell opened through the API
// (tty, stdin) by who, typed into a prompt at a time.
type interactiveShell struct {
	f       *terminalFixture
	who     string
	id      int64
	cursor  uint64
	out     bytes.Buffer
	prompts int
	prompt  []byte // what marks a prompt; promptMark by default
}

// onAgentdProcess moves f's session to a host whose agentd is the real
// binary in a process of its own: its event loop then competes with no
// console goroutines for the test process's threads, as in production.
func onAgentdProcess(t *testing.T, f *terminalFixture) {
	t.Helper()
	token := "agentd-token-" + randomHex(12)
	proc := startAgentdProcess(t, token)
	_, f.session = f.hostSession(t, "exec-host", "http://"+proc.Addr(), token)
}

func openShell(t *testing.T, f *terminalFixture, who string) *interactiveShell {
	t.Helper()
	// bash, whatever the test process's own $SHELL (a developer's zsh):
	// these tests type bash's lines (see TestTerminalZshIntegration for zsh).
	r := f.call(http.MethodPost, f.sessionPath("/commands"), who, map[string]any{"command": terminal.ShellCommand, "tty": true, "stdin": true, "rows": 50, "cols": 250,
		"env": map[string]string{"SHELL": "/bin/bash"}})
	wantStatus(t, "open the shell", r, http.StatusCreated)
	var o outputJSON
	r.decode(t, &o)
	return &interactiveShell{f: f, who: who, id: o.CommandID}
}

// awaitPrompt reads output until the shell has shown n prompts.
func (s *interactiveShell) awaitPrompt(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	mark := promptMark
	if s.prompt != nil {
		mark = s.prompt
	}
	for bytes.Count(s.out.Bytes(), mark) < n {
		if time.Now().After(deadline) {
			t.Fatalf("no prompt %d after 30 s; output: %q", n, s.out.String())
		}
		r := s.f.call(http.MethodGet, s.f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=2000", s.id, s.cursor), s.who, nil)
		wantStatus(t, "poll the shell", r, http.StatusOK)
		var o outputJSON
		r.decode(t, &o)
		for _, ch := range o.Chunks {
			if ch.Stream == agentd.StreamExec {
				t.Fatalf("an output poll returned exec records (chunk %d)", ch.ID)
			}
			s.out.Write(ch.Data)
		}
		s.cursor = max(s.cursor, o.NextCursor)
		if o.State != "running" {
			t.Fatalf("the shell ended (%s) waiting for prompt %d; output: %q", o.State, n, s.out.String())
		}
	}
}

// typeLines types each line at its own prompt, then exits and waits for
// the command's end to be recorded.
func (s *interactiveShell) typeLines(t *testing.T, lines ...string) {
	t.Helper()
	for _, l := range append(lines, "exit") {
		s.prompts++
		s.awaitPrompt(t, s.prompts)
		// "@who line" is typed by who (attached to s.who's shell).
		typist := s.who
		if who, rest, ok := strings.Cut(l, " "); ok && strings.HasPrefix(who, "@") {
			typist, l = who[1:], rest
		}
		wantStatus(t, "type "+l, s.f.call(http.MethodPost, s.f.sessionPath("/commands/%d/stdin", s.id), typist, map[string]any{"text": l + "\n"}), http.StatusNoContent)
	}
	if end := waitCommandEnded(t, s.f, s.id); end.State != "exited" {
		t.Fatalf("the shell ended %+v", end)
	}
}

type terminalCommandEvent struct {
	Actor struct {
		Type string `json:"type"`
		ID   string `json:"id"`
	} `json:"actor"`
	Action string `json:"action"`
	Target struct {
		ID string `json:"id"`
	} `json:"target"`
	Details struct {
		Argv            []string `json:"argv"`
		Cwd             string   `json:"cwd"`
		CommandID       int64    `json:"command_id"`
		SessionID       int64    `json:"session_id"`
		ExitCode        *int     `json:"exit_code"`
		ArgvUnavailable bool     `json:"argv_unavailable"`
	} `json:"details"`
}

// exportAudit reads the org's audit events matching q.
func (f *terminalFixture) exportAudit(t *testing.T, q string) []terminalCommandEvent {
	t.Helper()
	r := f.call(http.MethodGet, "/audit/export?format=jsonl&q="+strings.ReplaceAll(q, " ", "+"), "admin", nil)
	wantStatus(t, "audit export", r, http.StatusOK)
	var out []terminalCommandEvent
	for _, line := range bytes.Split(bytes.TrimSpace(r.body), []byte("\n")) {
		if len(line) == 0 || bytes.HasPrefix(line, []byte(`{"#export"`)) {
			continue // a filtered export's header
		}
		var e terminalCommandEvent
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("audit line %s: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

// recordedExec reads the exec records of a command's recording (its JSON
// form).
func (f *terminalFixture) recordedExec(t *testing.T, cid int64) []agentd.ExecRecord {
	t.Helper()
	r := f.call(http.MethodGet, f.sessionPath("/commands/%d/recording?format=json", cid), "admin", nil)
	wantStatus(t, "recording", r, http.StatusOK)
	var rec struct {
		Events []struct {
			Stream string `json:"stream"`
			Data   []byte `json:"data"`
		} `json:"events"`
	}
	r.decode(t, &rec)
	var out []agentd.ExecRecord
	for _, ev := range rec.Events {
		if ev.Stream != agentd.StreamExec {
			continue
		}
		got, err := agentd.ParseExecRecords(ev.Data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got...)
	}
	return out
}

var jumpEntry = regexp.MustCompile(`data-testid="(jump-line|jump-program)"><code>([^<]*)</code>`)

// replayLists reads the replay page's typed lines and programs.
func (f *terminalFixture) replayLists(t *testing.T, cid int64) (lines, programs []string) {
	t.Helper()
	r := f.e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/sessions/%d/commands/%d/replay", f.session, cid),
		cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["admin"]}}})
	wantStatus(t, "replay page", r, http.StatusOK)
	for _, m := range jumpEntry.FindAllStringSubmatch(string(r.body), -1) {
		if m[1] == "jump-line" {
			lines = append(lines, html.UnescapeString(m[2]))
		} else {
			programs = append(programs, html.UnescapeString(m[2]))
		}
	}
	return lines, programs
}

// TestTerminalCommandsAudited: what a person types into an interactive
// shell is audited by what ran, from the kernel: each program the shell
// started is a terminal.command event attributed to the person, even
// after the user switched the shell's own hooks off, while builtins (cd,
// echo) run nothing and programs below the shell's children stay in the
// recording. The replay page lists the typed lines (while the shell's
// marks were on) and the programs; recording search finds a program's
// arguments.
func TestTerminalCommandsAudited(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		onAgentdProcess(t, f)
		sh := openShell(t, f, "member")
		typed := []string{
			"cd /tmp",
			"echo first-marker",
			"/bin/sleep 0.22", // programs that live a moment: one gone at once may be gone before agentd reads its arguments
			"unset PROMPT_COMMAND; trap - DEBUG; /bin/sleep 0.23",
			"bash -c '/bin/sleep 0.24; :'", // "; :" keeps bash from running sleep in its own place

			"bash -c 'sleep 0.2; :' exec-only-$((6*7))",
			"@owner /bin/sleep 0.25",
		}
		sh.typeLines(t, typed...)
		cid := fmt.Sprint(sh.id)

		opened := f.exportAudit(t, "action:command.exec target:"+cid)
		if len(opened) != 1 {
			t.Fatalf("%d command.exec events for the shell", len(opened))
		}
		events := f.exportAudit(t, "action:terminal.command target:"+cid)
		find := func(argv ...string) []terminalCommandEvent {
			var out []terminalCommandEvent
			for _, e := range events {
				if slices.Equal(e.Details.Argv, argv) {
					out = append(out, e)
				}
			}
			return out
		}
		t.Run("programs are audited", func(t *testing.T) {
			for _, argv := range [][]string{
				{"/bin/sleep", "0.22"},
				{"/bin/sleep", "0.23"}, // after the shell's hooks were switched off
				{"bash", "-c", "/bin/sleep 0.24; :"},
				{"bash", "-c", "sleep 0.2; :", "exec-only-42"},
			} {
				got := find(argv...)
				if len(got) != 1 {
					t.Errorf("%d terminal.command events for %q, want 1 (of %d events)", len(got), argv, len(events))
					continue
				}
				e := got[0]
				if e.Actor != opened[0].Actor || e.Details.CommandID != sh.id || e.Details.SessionID != f.session || e.Details.Cwd != "/tmp" {
					t.Errorf("event for %q: %+v, want the typist %+v, command %d, session %d, cwd /tmp", argv, e, opened[0].Actor, sh.id, f.session)
				}
				if e.Details.ExitCode != nil && *e.Details.ExitCode != 0 {
					t.Errorf("event for %q has exit code %d", argv, *e.Details.ExitCode)
				}
			}
		})
		t.Run("a program is attributed to who typed it", func(t *testing.T) {
			// The owner attached (by typing into the member's shell): the
			// program its line started is the owner's, not the opener's.
			got := find("/bin/sleep", "0.25")
			if len(got) != 1 {
				t.Fatalf("%d terminal.command events for the owner's line, want 1", len(got))
			}
			if got[0].Actor == opened[0].Actor || got[0].Actor.Type != "user" {
				t.Errorf("the owner's program is attributed to %+v (the shell's opener is %+v)", got[0].Actor, opened[0].Actor)
			}
		})
		t.Run("builtins and grandchildren are not", func(t *testing.T) {
			for _, e := range events {
				line := strings.Join(e.Details.Argv, " ")
				if strings.Contains(line, "first-marker") || slices.Equal(e.Details.Argv, []string{"/bin/sleep", "0.24"}) {
					t.Errorf("unexpected terminal.command %q", line)
				}
			}
		})
		t.Run("the recording has every program", func(t *testing.T) {
			recs := f.recordedExec(t, sh.id)
			for _, want := range [][]string{{"/bin/sleep", "0.24"}, {"/bin/sleep", "0.22"}} {
				found := false
				for _, r := range recs {
					found = found || (r.Type == agentd.ExecRecordExec && slices.Equal(r.Argv, want))
				}
				if !found {
					t.Errorf("the recording has no exec record of %q", want)
				}
			}
		})
		t.Run("replay lists typed lines and programs", func(t *testing.T) {
			lines, programs := f.replayLists(t, sh.id)
			// The shell's marks were on for the first four lines (the
			// fourth switched them off as it ran).
			if len(lines) < 4 || !slices.Equal(lines[:4], typed[:4]) {
				t.Errorf("jump list %q, want it to start with %q", lines, typed[:4])
			}
			if slices.Contains(lines, typed[4]) {
				t.Errorf("jump list %q has a line typed after the marks were switched off", lines)
			}
			if !slices.Contains(programs, "$ /bin/sleep 0.22") || !slices.Contains(programs, "$ bash -c '/bin/sleep 0.24; :'") {
				t.Errorf("programs list %q", programs)
			}
		})
		t.Run("recording search finds program arguments", func(t *testing.T) {
			r := f.call(http.MethodGet, "/recordings?q=exec-only-42", "admin", nil)
			wantStatus(t, "search", r, http.StatusOK)
			mustContain(t, "search hit", string(r.body), fmt.Sprintf(`"id":%d`, sh.id))
		})
	})
}

// TestTerminalCommandBurst: a make-like burst (a script starting 5,000
// short processes) is one terminal.command in the audit log and 5,000
// exec records in the recording, none lost.
func TestTerminalCommandBurst(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		onAgentdProcess(t, f)
		sh := openShell(t, f, "member")
		const burst = `sh -c 'i=0; while [ $i -lt 5000 ]; do /bin/true; i=$((i+1)); done'`
		sh.typeLines(t, burst)
		events := f.exportAudit(t, fmt.Sprintf("action:terminal.command target:%d", sh.id))
		n := 0
		for _, e := range events {
			switch {
			case slices.Equal(e.Details.Argv, []string{"sh", "-c", "i=0; while [ $i -lt 5000 ]; do /bin/true; i=$((i+1)); done"}):
				n++
			case slices.Contains(e.Details.Argv, "/bin/true"):
				t.Errorf("a process below the shell's child is in the audit log: %+v", e)
			}
		}
		if n != 1 {
			t.Fatalf("%d terminal.command events for the burst, want 1", n)
		}
		var burstPID int
		recs := f.recordedExec(t, sh.id)
		for _, r := range recs {
			if r.Type == agentd.ExecRecordExec && r.Depth == 1 && len(r.Argv) == 3 && r.Argv[0] == "sh" {
				burstPID = r.PID
			}
		}
		count := 0
		for _, r := range recs {
			if r.Type == agentd.ExecRecordLost {
				t.Fatalf("exec records were lost: %+v", r)
			}
			if r.Type == agentd.ExecRecordExec && r.Depth == 2 && r.PPID == burstPID {
				count++
			}
		}
		if count != 5000 {
			t.Fatalf("%d exec records of the burst in the recording, want 5000", count)
		}
	})
}

// TestEnvironmentExecReportingShown: an environment's page says whether
// its agentd reports the programs started in terminals; one whose agentd
// has it switched off (--exec-reporting off) says they are not audited,
// and its shells still run, with neither exec records nor
// terminal.command events.
func TestEnvironmentExecReportingShown(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		url, token := agentdtest.Start(t, agentdtest.WithConfig(func(c *agentd.Config) { c.ExecReporting = agentd.ExecReportingDisabled }))
		_, offSession := f.hostSession(t, "no-exec-host", url, token)

		page := func(name string) string {
			t.Helper()
			r := f.e.json(http.MethodGet, "/api/v1/orgs/acme/environments", f.tokens["entered-admin"], nil)
			wantStatus(t, "list environments", r, http.StatusOK)
			var list struct {
				Items []struct {
					ID     int64
					Name   string
					Health struct {
						ExecReporting string `json:"exec_reporting"`
					}
				}
			}
			r.decode(t, &list)
			for _, e := range list.Items {
				if e.Name != name {
					continue
				}
				wantStatus(t, "test "+name, f.e.json(http.MethodPost, fmt.Sprintf("/api/v1/orgs/acme/environments/%d/test", e.ID), f.tokens["entered-admin"], nil), http.StatusOK)
				p := f.e.do(request{method: http.MethodGet, path: fmt.Sprintf("/o/acme/environments/%d", e.ID),
					cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens["entered-admin"]}}})
				wantStatus(t, "environment page", p, http.StatusOK)
				return string(p.body)
			}
			t.Fatalf("no environment %q in %s", name, r.body)
			return ""
		}
		mustContain(t, "reporting host", page("build-host"), `data-exec-reporting="netlink"`, "reported by the kernel and audited")
		mustContain(t, "host without reporting", page("no-exec-host"), `data-exec-reporting="off"`, "Unavailable (off): turned off (--exec-reporting off)",
			"not reported or audited")

		f.session = offSession
		sh := openShell(t, f, "member")
		sh.typeLines(t, "/bin/echo unreported-marker")
		if got := f.exportAudit(t, fmt.Sprintf("action:terminal.command target:%d", sh.id)); len(got) != 0 {
			t.Fatalf("%d terminal.command events from an agentd without exec reporting", len(got))
		}
		if recs := f.recordedExec(t, sh.id); len(recs) != 0 {
			t.Fatalf("%d exec records from an agentd without exec reporting", len(recs))
		}
		if lines, _ := f.replayLists(t, sh.id); !slices.Equal(lines, []string{"/bin/echo unreported-marker", "exit"}) {
			t.Fatalf("jump list %q: the shell's marks still delimit typed lines", lines)
		}
	})
}

// TestTerminalCommandsInAForkedShell: an API exec on a TTY whose shell is
// not the command itself (sh -c forks "bash -i" instead of running it in
// place) still has what is typed into that shell audited: agentd marks
// the children of an interactive shell (a shell by name with options only)
// as shell children; a non-interactive "bash -c" does not count.
func TestTerminalCommandsInAForkedShell(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		onAgentdProcess(t, f)
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "cd /tmp && bash --norc --noprofile -i",
			"env": map[string]string{"PS1": "ready> "}, "tty": true, "stdin": true})
		wantStatus(t, "open bash", r, http.StatusCreated)
		var o outputJSON
		r.decode(t, &o)
		sh := &interactiveShell{f: f, who: "member", id: o.CommandID, prompt: []byte("ready> ")}
		sh.typeLines(t, "/bin/sleep 0.26", "bash -c '/bin/echo inner-marker; /bin/sleep 0.27; :'")
		events := f.exportAudit(t, fmt.Sprintf("action:terminal.command target:%d", sh.id))
		var lines []string
		for _, e := range events {
			lines = append(lines, strings.Join(e.Details.Argv, " "))
		}
		for _, want := range []string{"bash --norc --noprofile -i", "/bin/sleep 0.26", "bash -c /bin/echo inner-marker; /bin/sleep 0.27; :"} {
			if !slices.Contains(lines, want) {
				t.Errorf("no terminal.command %q among %q", want, lines)
			}
		}
		for _, l := range lines {
			if l == "/bin/echo inner-marker" || l == "/bin/sleep 0.27" {
				t.Errorf("a program of a non-interactive bash -c is audited: %q", l)
			}
		}
	})
}
