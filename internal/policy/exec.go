package policy

import (
	"path"
	"strings"
)

// Exec is an agent's execution policy: ordered rules over programs and
// their arguments, the default for a program no rule matches, and how to
// treat what cannot be known before it runs.
type Exec struct {
	Default Action `json:"default"`
	// Dynamic decides a command whose program is not known before it runs
	// (named by a variable or a substitution, eval, source).
	Dynamic                Action `json:"dynamic"`
	ApprovalTimeoutSeconds int    `json:"approval_timeout_seconds"`
	// RequireEnforcement refuses sessions on environments that cannot
	// apply the rules where programs start.
	RequireEnforcement bool `json:"require_enforcement,omitempty"`
	// ExecPaths, with Default deny, are the only directories programs may
	// be executed from (kernel-enforced where Landlock is available).
	ExecPaths []string   `json:"exec_paths,omitempty"`
	Rules     []ExecRule `json:"rules"`
}

// ExecRule is one rule. Program is a glob over the program's name or its
// absolute path; Args a glob over the remaining words (`*` any words, `?`
// one); SHA256 names a program by its content; Text is a regular
// expression over a request's raw command text (the command patterns of
// before, kept as deny rules).
type ExecRule struct {
	Action  Action `json:"action"`
	Program string `json:"program,omitempty"`
	Args    string `json:"args,omitempty"`
	SHA256  string `json:"sha256,omitempty"`
	Text    string `json:"text,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// Program is one program about to start: its resolved absolute path, its
// argv (argv[0] as given), and, when a rule needs it, its content's hash.
type Program struct {
	Path string
	Argv []string
	// SHA256 returns the hex SHA-256 of the file at Path; nil when no
	// rule may ask for it.
	SHA256 func() (string, error)
}

// Decision is the outcome of evaluating a policy.
type Decision struct {
	Action Action
	// Rule is the index of the deciding rule, -1 when the default (or the
	// dynamic setting) decided.
	Rule int
	// Why says in a sentence which rule or setting decided and on what.
	Why string
}

// DecideProgram decides one program start, as agentd does at exec time:
// the strictest matching rule wins, else the default. Text rules do not
// apply here (there is no request text at exec time).
func (p *Exec) DecideProgram(prog Program) Decision {
	best := Decision{Action: p.Default, Rule: -1, Why: "no rule matches; the default is " + string(p.Default)}
	matched := false
	for i, r := range p.Rules {
		if r.Text != "" || !r.matchesProgram(prog) {
			continue
		}
		if !matched || r.Action.Stricter(best.Action) {
			best = Decision{Action: r.Action, Rule: i, Why: "rule " + itoa(i+1) + " (" + r.describe() + ")"}
			matched = true
		}
	}
	return best
}

// matchesProgram reports whether r names prog.
func (r ExecRule) matchesProgram(prog Program) bool {
	if r.Program == "" && r.SHA256 == "" {
		return false
	}
	if r.Program != "" && !matchProgram(r.Program, prog.Path, argv0(prog.Argv)) {
		return false
	}
	if r.SHA256 != "" {
		if prog.SHA256 == nil {
			return false
		}
		sum, err := prog.SHA256()
		if err != nil || !strings.EqualFold(sum, r.SHA256) {
			return false
		}
	}
	if r.Args != "" {
		var rest []string
		if len(prog.Argv) > 1 {
			rest = prog.Argv[1:]
		}
		if !MatchWords(r.Args, rest) {
			return false
		}
	}
	return true
}

// matchProgram matches a program glob: one with a slash against the
// absolute path, one without against the path's base name.
func matchProgram(glob, abs, arg0 string) bool {
	if strings.Contains(glob, "/") {
		ok, _ := path.Match(glob, abs)
		return ok
	}
	name := path.Base(abs)
	if abs == "" {
		name = path.Base(arg0)
	}
	ok, _ := path.Match(glob, name)
	return ok
}

// MatchWords matches words against a pattern of space-separated words in
// which `*` stands for any number of words, `?` for exactly one, and any
// other word is a glob over one word.
func MatchWords(pattern string, words []string) bool {
	return matchWords(strings.Fields(pattern), words)
}

func matchWords(pat, words []string) bool {
	for len(pat) > 0 {
		switch pat[0] {
		case "*":
			for i := 0; i <= len(words); i++ {
				if matchWords(pat[1:], words[i:]) {
					return true
				}
			}
			return false
		case "?":
			if len(words) == 0 {
				return false
			}
		default:
			if len(words) == 0 {
				return false
			}
			if ok, _ := path.Match(pat[0], words[0]); !ok {
				return false
			}
		}
		pat, words = pat[1:], words[1:]
	}
	return len(words) == 0
}

func (r ExecRule) describe() string {
	var parts []string
	parts = append(parts, string(r.Action))
	if r.Program != "" {
		parts = append(parts, "program "+r.Program)
	}
	if r.Args != "" {
		parts = append(parts, "args "+r.Args)
	}
	if r.SHA256 != "" {
		parts = append(parts, "sha256 "+r.SHA256)
	}
	if r.Text != "" {
		parts = append(parts, "text "+r.Text)
	}
	return strings.Join(parts, " ")
}

func argv0(argv []string) string {
	if len(argv) == 0 {
		return ""
	}
	return argv[0]
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b [20]byte
	n := len(b)
	for i > 0 {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
	}
	return string(b[n:])
}
