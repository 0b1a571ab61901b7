package policy_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/policy"
)

func TestMatchWords(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pattern string
		words   []string
		want    bool
	}{
		{"", nil, true},
		{"", []string{"x"}, false},
		{"*", nil, true},
		{"*", []string{"a", "b"}, true},
		{"?", nil, false},
		{"?", []string{"a"}, true},
		{"?", []string{"a", "b"}, false},
		{"push *", []string{"push"}, true},
		{"push *", []string{"push", "origin", "main"}, true},
		{"push *", []string{"pull", "origin"}, false},
		{"* --force *", []string{"push", "--force", "origin"}, true},
		{"* --force *", []string{"push", "origin"}, false},
		{"-rf /*", []string{"-rf", "/etc/passwd"}, true}, // * crosses slashes, as in case patterns
		{"-rf /", []string{"-rf", "/etc"}, false},
		{"-[rR]f *", []string{"-Rf", "x"}, true},
		{"-[!r]f", []string{"-rf"}, false},
		{`\*`, []string{"*"}, true},
		{`\*`, []string{"x"}, false},
		{"a? b", []string{"ab", "b"}, true},
		{"a?", []string{"a/"}, true},
		{"x[", []string{"x["}, false}, // malformed: matches nothing
	} {
		if got := policy.MatchWords(tc.pattern, tc.words); got != tc.want {
			t.Errorf("MatchWords(%q, %q) = %v, want %v", tc.pattern, tc.words, got, tc.want)
		}
	}
}

func TestMatchWordsIsNotExponential(t *testing.T) {
	t.Parallel()
	words := make([]string, 3000)
	for i := range words {
		words[i] = "a"
	}
	start := time.Now()
	if policy.MatchWords("* a * a * a * a * a * a * b", words) {
		t.Fatal("matched a pattern that needs a b")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("matching took %v", d)
	}
}

func TestDecideProgram(t *testing.T) {
	t.Parallel()
	sum := strings.Repeat("ab", 32)
	hash := func(s string, err error) func() (string, error) { return func() (string, error) { return s, err } }
	p := policy.Exec{Default: policy.Allow, Rules: []policy.ExecRule{
		{Action: policy.Deny, Program: "rm"},                                         // 1
		{Action: policy.Ask, Program: "git", Args: "push *"},                         // 2
		{Action: policy.Deny, Program: "/opt/bad/*"},                                 // 3
		{Action: policy.Deny, SHA256: sum},                                           // 4
		{Action: policy.Deny, Text: "curl"},                                          // 5: never at exec time
		{Action: policy.Allow, Program: "git", Args: "push --dry-run *"},             // 6
		{Action: policy.Allow, Program: "python3", SHA256: strings.Repeat("cd", 32)}, // 7
		{Action: policy.Deny, Program: "/usr/bin/shred"},                             // 8
	}}
	for _, tc := range []struct {
		name string
		prog policy.Program
		want policy.Action
		rule int
	}{
		{"name rule on the path's base", policy.Program{Path: "/usr/bin/rm", Argv: []string{"rm", "x"}}, policy.Deny, 0},
		{"the path decides the name, not argv0, for allow", policy.Program{Path: "/usr/bin/ls", Argv: []string{"git"}}, policy.Allow, -1},
		{"argv0 names it for deny", policy.Program{Path: "/bin/busybox", Argv: []string{"rm", "-rf", "/"}}, policy.Deny, 0},
		{"busybox applet", policy.Program{Path: "/bin/busybox", Argv: []string{"busybox", "rm", "x"}}, policy.Deny, 0},
		{"a busybox applet's path is busybox's", policy.Program{Path: "/opt/bad/busybox", Argv: []string{"busybox", "ls"}}, policy.Deny, 2},
		{"a busybox applet is not the file of its name", policy.Program{Path: "/bin/busybox", Argv: []string{"busybox", "shred", "x"}}, policy.Allow, -1},
		{"a program without a path meets path rules strictly", policy.Program{Argv: []string{"shred", "x"}}, policy.Deny, 2},
		{"busybox option", policy.Program{Path: "/bin/busybox", Argv: []string{"busybox", "--list"}}, policy.Allow, -1},
		{"args", policy.Program{Path: "/usr/bin/git", Argv: []string{"git", "push", "origin"}}, policy.Ask, 1},
		{"strictest wins over a narrower allow", policy.Program{Path: "/usr/bin/git", Argv: []string{"git", "push", "--dry-run", "x"}}, policy.Ask, 1},
		{"args not matching", policy.Program{Path: "/usr/bin/git", Argv: []string{"git", "pull"}}, policy.Allow, -1},
		{"path rule", policy.Program{Path: "/opt/bad/tool", Argv: []string{"tool"}}, policy.Deny, 2},
		{"path rule cleans the path", policy.Program{Path: "/opt/good/../bad/tool", Argv: []string{"tool"}}, policy.Deny, 2},
		{"path rule does not cross directories", policy.Program{Path: "/opt/bad/sub/tool", Argv: []string{"tool"}}, policy.Allow, -1},
		{"content", policy.Program{Path: "/tmp/x", Argv: []string{"x"}, SHA256: hash(strings.ToUpper(sum), nil)}, policy.Deny, 3},
		{"other content", policy.Program{Path: "/tmp/x", Argv: []string{"x"}, SHA256: hash(strings.Repeat("00", 32), nil)}, policy.Allow, -1},
		{"no hash function", policy.Program{Path: "/tmp/x", Argv: []string{"x"}}, policy.Allow, -1},
		{"a file that cannot be hashed meets deny rules", policy.Program{Path: "/tmp/x", Argv: []string{"x"}, SHA256: hash("", errors.New("gone"))}, policy.Deny, 3},
		{"text rules do not apply", policy.Program{Path: "/usr/bin/curl", Argv: []string{"curl"}}, policy.Allow, -1},
	} {
		got := p.DecideProgram(tc.prog)
		if got.Action != tc.want || got.Rule != tc.rule {
			t.Errorf("%s: %+v decided %s by rule %d (%s), want %s by %d", tc.name, tc.prog, got.Action, got.Rule, got.Why, tc.want, tc.rule)
		}
	}
}

func TestNeedsSHA256(t *testing.T) {
	t.Parallel()
	p := policy.DefaultExec()
	if p.NeedsSHA256() {
		t.Error("the default policy needs hashes")
	}
	p.Rules = append(p.Rules, policy.ExecRule{Action: policy.Deny, SHA256: strings.Repeat("ab", 32)})
	if !p.NeedsSHA256() {
		t.Error("a content rule needs no hashes")
	}
}

func TestDecideProgramDefaultsAndExecPaths(t *testing.T) {
	t.Parallel()
	var zero policy.Exec
	if d := zero.DecideProgram(policy.Program{Path: "/bin/ls"}); d.Action != policy.Allow || d.Rule != -1 {
		t.Errorf("an empty policy decided %+v, want allow by default", d)
	}
	broken := policy.Exec{Default: "block"}
	if d := broken.DecideProgram(policy.Program{Path: "/bin/ls"}); d.Action != policy.Deny {
		t.Errorf("an unknown default decided %+v, want deny (fail closed)", d)
	}
	p := policy.Exec{Default: policy.Deny, ExecPaths: []string{"/usr/bin/", "/opt/tools"}, Rules: []policy.ExecRule{{Action: policy.Allow, Program: "*"}}}
	for path, want := range map[string]policy.Action{
		"/usr/bin/ls":           policy.Allow,
		"/opt/tools/x":          policy.Allow,
		"/opt/toolsmith/x":      policy.Deny,
		"/tmp/ls":               policy.Deny,
		"/usr/bin/../../tmp/ls": policy.Deny,
	} {
		if d := p.DecideProgram(policy.Program{Path: path, Argv: []string{"x"}}); d.Action != want {
			t.Errorf("%s: %+v, want %s", path, d, want)
		}
	}
}

func TestDefaultsNormalizeAndDigest(t *testing.T) {
	t.Parallel()
	d := policy.DefaultExec()
	if got := string(d.Canonical()); got != `{"default":"allow","dynamic":"ask","approval_timeout_seconds":600,"rules":[]}` {
		t.Errorf("DefaultExec canonical JSON %s", got)
	}
	var empty policy.Exec
	if empty.Digest() != d.Digest() {
		t.Error("an empty policy and the default one digest differently; normalization should make them equal")
	}
	a := policy.Exec{Default: " Deny", ExecPaths: []string{"/usr/bin/", "/bin", "/bin"}, Rules: []policy.ExecRule{
		{Action: "DENY", Program: " rm ", Args: "  -rf   * ", SHA256: strings.Repeat("AB", 32)},
	}}
	b := policy.Exec{Default: policy.Deny, Dynamic: policy.Ask, ApprovalTimeoutSeconds: 600, ExecPaths: []string{"/bin", "/usr/bin"}, Rules: []policy.ExecRule{
		{Action: policy.Deny, Program: "rm", Args: "-rf *", SHA256: strings.Repeat("ab", 32)},
	}}
	if a.Digest() != b.Digest() {
		t.Errorf("one policy written two ways digests differently:\n%s\n%s", a.Canonical(), b.Canonical())
	}
	if a.ExecPaths[0] != "/usr/bin/" {
		t.Error("Canonical changed the policy it was called on")
	}
	c := b
	c.Rules = []policy.ExecRule{{Action: policy.Ask, Program: "rm", Args: "-rf *", SHA256: strings.Repeat("ab", 32)}}
	if c.Digest() == b.Digest() {
		t.Error("different policies digest alike")
	}
	if len(b.Digest()) != 64 {
		t.Errorf("digest %q is not hex SHA-256", b.Digest())
	}
}

func TestFromPatterns(t *testing.T) {
	t.Parallel()
	p := policy.FromPatterns([]string{`rm\s+-rf`, "  ", ` shutdown `})
	want := []policy.ExecRule{
		{Action: policy.Deny, Text: `rm\s+-rf`, Reason: policy.MigratedReason},
		{Action: policy.Deny, Text: `shutdown`, Reason: policy.MigratedReason},
	}
	if p.Default != policy.Allow || p.Dynamic != policy.Ask || len(p.Rules) != len(want) || p.Rules[0] != want[0] || p.Rules[1] != want[1] {
		t.Fatalf("FromPatterns = %+v", p)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestCompileRefusesBrokenTextPatterns(t *testing.T) {
	t.Parallel()
	p := policy.Exec{Rules: []policy.ExecRule{{Action: policy.Deny, Text: "("}}}
	var pe *policy.PolicyError
	if _, err := p.Compile(); !errors.As(err, &pe) {
		t.Fatalf("Compile() error %v, want a *PolicyError", err)
	}
}
