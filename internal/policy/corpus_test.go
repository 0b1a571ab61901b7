package policy_test

import (
	"bufio"
	"os"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/policy"
)

// corpusPolicy is the policy the corpora are checked against: rm is
// denied (rule 2), among rules of the kinds agents carry.
func corpusPolicy(dynamic policy.Action) policy.Exec {
	p := policy.DefaultExec()
	p.Dynamic = dynamic
	p.Rules = []policy.ExecRule{
		{Action: policy.Allow, Program: "ls"},
		{Action: policy.Deny, Program: "rm", Reason: "deleting files needs a person"},
		{Action: policy.Ask, Program: "git", Args: "push *"},
		{Action: policy.Deny, Program: "shred"},
	}
	return p
}

const rmRule = 1

type corpusLine struct {
	want, line string
	lineNo     int
}

// readCorpus reads a corpus file: an expected outcome, blanks, the
// command line (↵ for a newline). Without an outcome column, every line
// expects allow.
func readCorpus(t testing.TB, name string, outcomes bool) []corpusLine {
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []corpusLine
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		text := sc.Text()
		if strings.TrimSpace(text) == "" || strings.HasPrefix(text, "#") {
			continue
		}
		want, line := "allow", text
		if outcomes {
			var ok bool
			want, line, ok = strings.Cut(text, " ")
			if !ok {
				t.Fatalf("%s:%d: no outcome: %q", name, n, text)
			}
		}
		out = append(out, corpusLine{want: want, line: strings.ReplaceAll(strings.TrimLeft(line, " "), "↵", "\n"), lineNo: n})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDeniedCorpus(t *testing.T) {
	t.Parallel()
	lines := readCorpus(t, "denied_corpus.txt", true)
	if len(lines) < 40 {
		t.Fatalf("the denied corpus has %d forms, want at least 40", len(lines))
	}
	for _, dynamic := range []policy.Action{policy.Ask, policy.Deny, policy.Allow} {
		p := corpusPolicy(dynamic)
		c, err := p.Compile()
		if err != nil {
			t.Fatal(err)
		}
		for _, cl := range lines {
			d, err := c.DecideCommand(cl.line, nil)
			if err != nil {
				t.Errorf("denied_corpus.txt:%d %q: %v", cl.lineNo, cl.line, err)
				continue
			}
			switch cl.want {
			case "deny":
				if d.Action != policy.Deny || d.Rule != rmRule || d.Command == nil || d.Command.Name != "rm" {
					t.Errorf("denied_corpus.txt:%d %q (dynamic %s): want denied by the rm rule, got %s: %s", cl.lineNo, cl.line, dynamic, d.Action, d.Explain())
				}
			case "dynamic":
				// With dynamic allow, an allow rule may decide as well.
				if d.Action != dynamic || d.Rule != -1 && dynamic != policy.Allow {
					t.Errorf("denied_corpus.txt:%d %q (dynamic %s): want decided by the dynamic setting, got %s: %s", cl.lineNo, cl.line, dynamic, d.Action, d.Explain())
				}
			default:
				t.Fatalf("denied_corpus.txt:%d: unknown outcome %q", cl.lineNo, cl.want)
			}
		}
	}
}

func TestAllowedCorpus(t *testing.T) {
	t.Parallel()
	lines := readCorpus(t, "allowed_corpus.txt", false)
	p := corpusPolicy(policy.Ask)
	c, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range lines {
		d, err := c.DecideCommand(cl.line, nil)
		if err != nil {
			t.Errorf("allowed_corpus.txt:%d %q: %v", cl.lineNo, cl.line, err)
			continue
		}
		if d.Action != policy.Allow {
			t.Errorf("allowed_corpus.txt:%d %q: want allowed, got %s: %s", cl.lineNo, cl.line, d.Action, d.Explain())
		}
	}
}
