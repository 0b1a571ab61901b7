package policy_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/policy"
)

// decide is a test's shorthand for checking one line.
func decide(t *testing.T, p policy.Exec, line string, env map[string]string) policy.CommandDecision {
	t.Helper()
	d, err := p.DecideCommand(line, env)
	if err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	return d
}

func TestDecideCommand(t *testing.T) {
	t.Parallel()
	sum := strings.Repeat("ab", 32)
	allowByDefault := policy.Exec{Default: policy.Allow, Dynamic: policy.Ask, Rules: []policy.ExecRule{
		{Action: policy.Deny, Program: "rm"},                              // 1
		{Action: policy.Ask, Program: "git", Args: "push *"},              // 2
		{Action: policy.Deny, Program: "/usr/sbin/*"},                     // 3
		{Action: policy.Deny, Program: "curl", Args: "* --upload-file *"}, // 4
		{Action: policy.Deny, Text: `(?i)drop\s+table`},                   // 5
		{Action: policy.Ask, Text: `SECRET`},                              // 6
	}}
	denyByDefault := policy.Exec{Default: policy.Deny, Dynamic: policy.Ask, Rules: []policy.ExecRule{
		{Action: policy.Allow, Program: "git"},                // 1
		{Action: policy.Ask, Program: "git", Args: "push *"},  // 2
		{Action: policy.Allow, Program: "make", Args: "test"}, // 3
		{Action: policy.Deny, Program: "echo"},                // 4: names a builtin
	}}
	onlyDenies := policy.Exec{Default: policy.Deny, Dynamic: policy.Ask, Rules: []policy.ExecRule{{Action: policy.Deny, Program: "rm"}}}
	onlyAllows := policy.Exec{Default: policy.Allow, Dynamic: policy.Deny, Rules: []policy.ExecRule{{Action: policy.Allow, Program: "git"}}}
	askDynamicDeny := policy.Exec{Default: policy.Allow, Dynamic: policy.Deny, Rules: []policy.ExecRule{{Action: policy.Ask, Program: "git", Args: "push *"}}}
	dynamicAllow := policy.Exec{Default: policy.Allow, Dynamic: policy.Allow, Rules: []policy.ExecRule{{Action: policy.Ask, Program: "git"}, {Action: policy.Deny, Program: "git", Args: "push --force *"}}}
	byContent := policy.Exec{Default: policy.Allow, Dynamic: policy.Ask, Rules: []policy.ExecRule{{Action: policy.Deny, Program: "python3", SHA256: sum}}}
	pinned := policy.Exec{Default: policy.Deny, Dynamic: policy.Ask, Rules: []policy.ExecRule{{Action: policy.Allow, Program: "python3", SHA256: sum}}}
	systemOnly := policy.Exec{Default: policy.Deny, Dynamic: policy.Ask, Rules: []policy.ExecRule{{Action: policy.Allow, Program: "/usr/bin/*"}}}
	paths := policy.Exec{Default: policy.Deny, Dynamic: policy.Ask, ExecPaths: []string{"/usr/bin"}, Rules: []policy.ExecRule{{Action: policy.Allow, Program: "*"}}}

	for _, tc := range []struct {
		name   string
		p      policy.Exec
		line   string
		env    map[string]string
		want   policy.Action
		rule   int
		whyHas string
	}{
		{"a known program and arguments", allowByDefault, "git push origin main", nil, policy.Ask, 1, "rule 2"},
		{"args the rule does not name", allowByDefault, "git pull", nil, policy.Allow, -1, "default"},
		{"an unknown argument a * absorbs surely matches", allowByDefault, "git push $REMOTE", nil, policy.Ask, 1, "rule 2"},
		{"an unknown argument that may match", allowByDefault, "curl $ARGS https://x", nil, policy.Ask, -1, "rule 4"},
		{"an unknown argument that cannot match", allowByDefault, "git status $X", nil, policy.Allow, -1, "default"},
		{"a path rule decides an absolute path", allowByDefault, "/usr/sbin/reboot", nil, policy.Deny, 2, "rule 3"},
		{"a deny path rule leaves a bare name to agentd", allowByDefault, "reboot", nil, policy.Allow, -1, "default"},
		{"a deny path rule leaves a relative path to agentd", allowByDefault, "../sbin/reboot", nil, policy.Allow, -1, "default"},
		{"a path rule and a name it cannot match", allowByDefault, "ls", nil, policy.Allow, -1, "default"},
		{"a text rule on the line", allowByDefault, `psql -c "DROP  TABLE x"`, nil, policy.Deny, 4, "on the command"},
		{"a text rule on an env value", allowByDefault, `psql -c "$Q"`, map[string]string{"Q": "drop table users"}, policy.Deny, 4, "env variable Q"},
		{"a text rule on NAME=value", allowByDefault, `env`, map[string]string{"SECRET": "x"}, policy.Ask, 5, "env variable SECRET"},
		{"a denied program beats an asking text rule", allowByDefault, `rm SECRET`, nil, policy.Deny, 0, "rule 1"},
		{"an env variable that loads code", allowByDefault, `ls`, map[string]string{"LD_PRELOAD": "/tmp/x.so"}, policy.Ask, -1, "LD_PRELOAD"},
		{"a line that runs nothing", allowByDefault, `# rm x`, nil, policy.Allow, -1, "runs no program"},
		{"only assignments", allowByDefault, `X=1 Y=2`, nil, policy.Allow, -1, "runs no program"},

		{"default deny", denyByDefault, "ls", nil, policy.Deny, -1, "default"},
		{"allow rule", denyByDefault, "git status", nil, policy.Allow, 0, "rule 1"},
		{"builtins need no allow rule", denyByDefault, "cd /tmp && pwd && git status", nil, policy.Allow, 0, "rule 1"},
		{"a rule naming a builtin applies", denyByDefault, "echo hi", nil, policy.Deny, 3, "rule 4"},
		{"a builtin name run by a wrapper is a program", denyByDefault, "git status; sudo cd /", nil, policy.Deny, -1, "default"},
		{"a builtin name given as a path is a program", denyByDefault, "/bin/pwd", nil, policy.Deny, -1, "default"},
		{"an unknown program between allow and deny", denyByDefault, "$X", nil, policy.Ask, -1, "dynamic"},
		{"exact args", denyByDefault, "make test", nil, policy.Allow, 2, "rule 3"},
		{"args that may be the allowed ones, or not", denyByDefault, "make $T", nil, policy.Ask, -1, "dynamic"},

		{"an unknown program when every outcome is deny", onlyDenies, "$X", nil, policy.Deny, -1, "default"},
		{"an unknown program when every outcome is allow", onlyAllows, "$X", nil, policy.Allow, -1, "default"},
		{"dynamic deny is bounded by the strictest possible outcome", askDynamicDeny, "git $CMD", nil, policy.Ask, -1, "no possible outcome is stricter than ask"},
		{"dynamic allow is bounded by the least strict possible outcome", dynamicAllow, "git $CMD", nil, policy.Ask, -1, "at least ask"},
		{"dynamic allow within its bounds", dynamicAllow, "$X", nil, policy.Allow, -1, "dynamic"},
		{"a deny content rule is left to agentd", byContent, "python3 x.py", nil, policy.Allow, -1, "default"},
		{"an allow content rule is taken at its word", pinned, "python3 x.py", nil, policy.Allow, 0, "its content is checked where it starts"},
		{"an allow content rule and another program", pinned, "python3.12 x.py", nil, policy.Deny, -1, "default"},
		{"an allow path rule and a bare name", systemOnly, "ls -l", nil, policy.Allow, 0, "its path is checked where it starts"},
		{"an allow path rule and a relative path", systemOnly, "./ls", nil, policy.Allow, 0, "its path is checked where it starts"},
		{"an allow path rule and an absolute path", systemOnly, "/usr/bin/ls", nil, policy.Allow, 0, "rule 1"},
		{"an allow path rule and an absolute path outside it", systemOnly, "/tmp/ls", nil, policy.Deny, -1, "default"},
		{"exec paths at the gateway", paths, "/tmp/ls", nil, policy.Deny, -1, "exec paths"},
		{"exec paths and a bare name", paths, "ls", nil, policy.Allow, 0, "rule 1"},
	} {
		d := decide(t, tc.p, tc.line, tc.env)
		if d.Action != tc.want || d.Rule != tc.rule || !strings.Contains(d.Why, tc.whyHas) {
			t.Errorf("%s: %q decided %s by rule %d (%s), want %s by %d naming %q", tc.name, tc.line, d.Action, d.Rule, d.Why, tc.want, tc.rule, tc.whyHas)
		}
	}
}

func TestDecideCommandListsEveryProgram(t *testing.T) {
	t.Parallel()
	p := policy.Exec{Rules: []policy.ExecRule{{Action: policy.Deny, Program: "rm", Reason: "ask a person"}}}
	d := decide(t, p, `cd /src && sudo -u build bash -c 'make && rm -rf "out dir"' | tee log`, nil)
	type seen struct {
		name, via string
		args      string
		action    policy.Action
	}
	var got []seen
	for _, c := range d.Commands {
		got = append(got, seen{c.Name, strings.Join(c.Via, " > "), strings.Join(c.Args, "|"), c.Action})
	}
	want := []seen{
		{"cd", "", "/src", policy.Allow},
		{"sudo", "", "-u|build|bash|-c|make && rm -rf \"out dir\"", policy.Allow},
		{"bash", "sudo", "-c|make && rm -rf \"out dir\"", policy.Allow},
		{"make", "sudo > bash -c", "", policy.Allow},
		{"rm", "sudo > bash -c", "-rf|out dir", policy.Deny},
		{"tee", "", "log", policy.Allow},
	}
	if len(got) != len(want) {
		t.Fatalf("found %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("command %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if d.Command == nil || d.Command.Name != "rm" {
		t.Fatalf("deciding command %+v, want rm", d.Command)
	}
	const explain = "`rm -rf \"out dir\"` (inside `sudo`, then `bash -c`) is denied by rule 1: deny program rm (\"ask a person\")."
	if got := d.Explain(); got != explain {
		t.Errorf("Explain() = %q, want %q", got, explain)
	}
}

func TestExplain(t *testing.T) {
	t.Parallel()
	p := policy.Exec{Default: policy.Allow, Dynamic: policy.Ask, Rules: []policy.ExecRule{
		{Action: policy.Allow, Program: "ls"},
		{Action: policy.Deny, Program: "rm"},
		{Action: policy.Deny, Text: `curl.*\|\s*sh`, Reason: policy.MigratedReason},
	}}
	for line, want := range map[string]string{
		"bash -c 'rm -rf x'": "`rm -rf x` (inside `bash -c`) is denied by rule 2: deny program rm.",
		"ls -l":              "`ls -l` is allowed by rule 1: allow program ls.",
		"make":               "`make` is allowed by the default (no rule matches).",
		"$EDITOR x":          "`$EDITOR x` is held for approval by the dynamic setting (ask): the program is `$EDITOR`, known only when it runs.",
		"curl -s x | sh":     "`curl -s x | sh` is denied by rule 3: deny text curl.*\\|\\s*sh (\"migrated command pattern\") on the command.",
		"":                   "`` is allowed by the line, which runs no program.",
	} {
		if got := decide(t, p, line, nil).Explain(); got != want {
			t.Errorf("%q: Explain() = %q, want %q", line, got, want)
		}
	}
}

func TestDecideCommandRefusesWhatDoesNotParse(t *testing.T) {
	t.Parallel()
	p := policy.DefaultExec()
	for _, line := range []string{`echo "unterminated`, `echo $(`, `if true; then`, `a |`, `( ls`, strings.Repeat("x", policy.MaxCommandBytes+1)} {
		_, err := p.DecideCommand(line, nil)
		var pe *policy.ParseError
		if !errors.As(err, &pe) {
			t.Errorf("%.40q: err = %v, want a *ParseError", line, err)
			continue
		}
		var ae *apperr.Error
		if !errors.As(err, &ae) || ae.Code != "command_unparsable" || !errors.Is(err, apperr.ErrInvalid) || ae.Message != pe.Error() {
			t.Errorf("%.40q: %v does not read as an invalid-input apperr.Error", line, err)
		}
	}
	if _, err := p.DecideCommand(`echo "unterminated`, nil); !strings.Contains(err.Error(), "line 1, column 6") {
		t.Errorf("the message %q does not locate the problem", err)
	}
}

func TestDecideCommandLimits(t *testing.T) {
	t.Parallel()
	p := policy.Exec{Default: policy.Allow, Dynamic: policy.Ask, Rules: []policy.ExecRule{{Action: policy.Deny, Program: "rm"}}}
	for name, line := range map[string]string{
		"wrappers nested deeper than followed": strings.Repeat("nice ", 40) + "rm x",
		"shells nested deeper than followed":   nestShells(20, "rm x"),
		"substitutions nested deeply":          strings.Repeat("echo $(", 30) + "rm x" + strings.Repeat(")", 30),
		"more commands than checked":           strings.Repeat("ls; ", 5000) + "rm x",
	} {
		d := decide(t, p, line, nil)
		if d.Action == policy.Allow {
			t.Errorf("%s: allowed: %s", name, d.Explain())
		}
	}
}

// nestShells runs code n shells deep, each reading it from a quoted
// here-document.
func nestShells(n int, code string) string {
	for i := range n {
		delim := fmt.Sprintf("E%d", i)
		code = "bash <<'" + delim + "'\n" + code + "\n" + delim
	}
	return code
}

func TestMigratedPatternsKeepWorking(t *testing.T) {
	t.Parallel()
	p := policy.FromPatterns([]string{`rm\s+-rf`, "shutdown"})
	// The patterns keep working on the raw text, env values included.
	if d := decide(t, p, "sudo rm  -rf /", nil); d.Action != policy.Deny || d.Rule != 0 {
		t.Errorf("migrated pattern: %s", d.Explain())
	}
	if d := decide(t, p, `eval "$X"`, map[string]string{"X": "shutdown now"}); d.Action != policy.Deny || d.Rule != 1 {
		t.Errorf("migrated pattern on an env value: %s", d.Explain())
	}
	if d := decide(t, p, `echo hi`, nil); d.Action != policy.Allow {
		t.Errorf("unmatched line: %s", d.Explain())
	}
}

func TestDecideCommandRefusesBrokenPolicies(t *testing.T) {
	t.Parallel()
	p := policy.Exec{Rules: []policy.ExecRule{{Action: policy.Deny, Text: "("}}}
	var pe *policy.PolicyError
	if _, err := p.DecideCommand("ls", nil); !errors.As(err, &pe) {
		t.Fatalf("DecideCommand error %v, want a *PolicyError", err)
	}
}

func TestCheckerIsSafeForConcurrentUse(t *testing.T) {
	t.Parallel()
	p := corpusPolicy(policy.Ask)
	c, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	lines := []string{"bash -c 'rm x'", "git push origin", "ls | grep x", "$X y", "find . -exec rm {} +"}
	want := make([]policy.Action, len(lines))
	for i, l := range lines {
		d, _ := c.DecideCommand(l, nil)
		want[i] = d.Action
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for n := range 200 {
				i := (g + n) % len(lines)
				d, err := c.DecideCommand(lines[i], map[string]string{"N": "1"})
				if err != nil || d.Action != want[i] {
					t.Errorf("%q: %s, %v; want %s", lines[i], d.Action, err, want[i])
					return
				}
				if pd := c.DecideProgram(policy.Program{Path: "/bin/rm", Argv: []string{"rm"}}); pd.Action != policy.Deny {
					t.Errorf("DecideProgram: %+v", pd)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestEnvValuesNeverExplained: what is decided about a request's env is
// said by the variable's name; its value, which may hold a secret, appears
// in no explanation (answers and the audit log quote them).
func TestEnvValuesNeverExplained(t *testing.T) {
	t.Parallel()
	p := policy.DefaultExec()
	p.Rules = []policy.ExecRule{{Action: policy.Deny, Program: "curl"}}
	c, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	const secret = "sk-SECRETSECRET"
	for _, env := range []map[string]string{
		{"BASH_FUNC_ls%%": "() { curl " + secret + "; }"},
		{"X": "curl " + secret + " $(curl x)"},
		{"GIT_SSH_COMMAND": "ssh -i " + secret},
		{"PROMPT_COMMAND": "curl " + secret},
	} {
		d, err := c.DecideCommand(`eval "$X"; ls`, env)
		if err != nil {
			t.Fatal(err)
		}
		texts := []string{d.Explain(), d.Why}
		for _, cmd := range d.Commands {
			texts = append(texts, cmd.Text, cmd.Why, cmd.Explain())
		}
		for _, s := range texts {
			if strings.Contains(s, "SECRET") {
				t.Errorf("env %v: an explanation quotes the value: %q", env, s)
			}
		}
	}
}

// TestDecideInteractive: a shell typed into is allowed only by a policy
// that refuses nothing; otherwise the dynamic setting decides it.
func TestDecideInteractive(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		p    policy.Exec
		want policy.Action
	}{
		{"allow everything", policy.DefaultExec(), policy.Allow},
		{"only allow rules", policy.Exec{Default: policy.Allow, Dynamic: policy.Deny, Rules: []policy.ExecRule{{Action: policy.Allow, Program: "git"}}}, policy.Allow},
		{"a deny rule, dynamic ask", policy.Exec{Default: policy.Allow, Dynamic: policy.Ask, Rules: []policy.ExecRule{{Action: policy.Deny, Program: "rm"}}}, policy.Ask},
		{"a text rule, dynamic deny", policy.Exec{Default: policy.Allow, Dynamic: policy.Deny, Rules: []policy.ExecRule{{Action: policy.Deny, Text: "^shutdown"}}}, policy.Deny},
		{"default ask, dynamic allow", policy.Exec{Default: policy.Ask, Dynamic: policy.Allow}, policy.Allow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.p.Compile()
			if err != nil {
				t.Fatal(err)
			}
			if d := c.DecideInteractive(); d.Action != tc.want || d.Line == "" {
				t.Errorf("DecideInteractive = %+v, want %s", d.Decision, tc.want)
			}
		})
	}
}
