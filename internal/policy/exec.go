package policy

import (
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// Defaults and limits of an execution policy.
const (
	DefaultApprovalTimeoutSeconds = 600
	MinApprovalTimeoutSeconds     = 60
	MaxApprovalTimeoutSeconds     = 86400
	MaxExecRules                  = 200
	MaxExecPaths                  = 64
	// MaxReason bounds a rule's reason, shown to whoever is refused.
	MaxReason = 500
	// MaxPattern bounds a rule's program, args and text patterns.
	MaxPattern = 500
)

// MigratedReason is the reason of the rules FromPatterns makes.
const MigratedReason = "migrated command pattern"

// DefaultExec is the policy of an agent that has none: every program is
// allowed, what cannot be known before it runs is asked about (which,
// with no rule to deny anything, allows it too), approvals wait ten
// minutes.
func DefaultExec() Exec {
	return Exec{Default: Allow, Dynamic: Ask, ApprovalTimeoutSeconds: DefaultApprovalTimeoutSeconds, Rules: []ExecRule{}}
}

// FromPatterns is the policy of an agent that had a command policy (RE2
// patterns denying a command whose text matches): the default policy with
// each pattern as a deny rule on the raw text. Empty patterns are dropped.
func FromPatterns(patterns []string) Exec {
	p := DefaultExec()
	for _, pat := range patterns {
		if pat = strings.TrimSpace(pat); pat != "" {
			p.Rules = append(p.Rules, ExecRule{Action: Deny, Text: pat, Reason: MigratedReason})
		}
	}
	return p
}

// Normalize fills what is unset with its default (default allow, dynamic
// ask, a 600 s approval timeout, no rules), trims what people type,
// lower-cases actions and hashes, and cleans paths, so that two ways of
// writing one policy compare and digest alike. Validate afterwards.
func (p *Exec) Normalize() {
	p.Default = normalAction(p.Default)
	if p.Default == "" {
		p.Default = Allow
	}
	p.Dynamic = normalAction(p.Dynamic)
	if p.Dynamic == "" {
		p.Dynamic = Ask
	}
	if p.ApprovalTimeoutSeconds == 0 {
		p.ApprovalTimeoutSeconds = DefaultApprovalTimeoutSeconds
	}
	var paths []string
	for _, d := range p.ExecPaths {
		if d = strings.TrimSpace(d); d != "" {
			if strings.HasPrefix(d, "/") && !hasDotDot(d) {
				d = path.Clean(d)
			}
			paths = append(paths, d)
		}
	}
	slices.Sort(paths)
	p.ExecPaths = slices.Compact(paths)
	rules := make([]ExecRule, len(p.Rules))
	for i, r := range p.Rules {
		r.Action = normalAction(r.Action)
		r.Program = strings.TrimSpace(r.Program)
		if strings.HasPrefix(r.Program, "/") && !hasDotDot(r.Program) {
			r.Program = path.Clean(r.Program)
		}
		r.Args = strings.Join(strings.Fields(r.Args), " ")
		r.SHA256 = strings.ToLower(strings.TrimSpace(r.SHA256))
		r.Text = strings.TrimSpace(r.Text)
		r.Reason = strings.TrimSpace(r.Reason)
		rules[i] = r
	}
	p.Rules = rules
}

func hasDotDot(p string) bool { return slices.Contains(strings.Split(p, "/"), "..") }

// Canonical is the policy's normalized JSON, byte for byte the same for
// every way of writing one policy (fields in a fixed order, no HTML
// escaping): what a version stores and Digest hashes.
func (p Exec) Canonical() []byte {
	p.ExecPaths = slices.Clone(p.ExecPaths)
	p.Normalize()
	return canonical(p)
}

// Digest is the hex SHA-256 of Canonical: equal digests, equal policies.
func (p Exec) Digest() string { return digest(p.Canonical()) }

// Program is one program about to start: its resolved absolute path, its
// argv (argv[0] as given), and, when a rule needs it, its content's hash.
type Program struct {
	Path string
	Argv []string
	// SHA256 returns the hex SHA-256 of the file at Path; nil when no
	// rule may ask for it.
	SHA256 func() (string, error)
}

// DecideProgram decides one program start, as agentd does at exec time:
// the strictest matching rule wins, else the default. Text rules do not
// apply here (there is no request text at exec time). A program outside
// ExecPaths is denied. Deny and ask rules also match the base name of
// argv[0] (a multi-call binary such as busybox, started through a link
// named rm, is rm), and `busybox rm x` is decided as rm too, since its
// applets start no program of their own.
func (p *Exec) DecideProgram(prog Program) Decision { return p.checker().DecideProgram(prog) }

// DecideProgram is Exec.DecideProgram on a compiled policy, for callers
// deciding many program starts.
func (c *Checker) DecideProgram(prog Program) Decision {
	t := target{atExec: true, hash: onceHash(prog.SHA256)}
	if prog.Path != "" {
		t.path = path.Clean(prog.Path)
		t.name = path.Base(t.path)
		if !strings.HasPrefix(t.path, "/") {
			t.path = ""
		}
	}
	arg0 := ""
	if len(prog.Argv) > 0 {
		arg0 = path.Base(prog.Argv[0])
	}
	if t.name == "" {
		t.name = arg0
	} else if arg0 != t.name {
		t.argv0 = arg0
	}
	if len(prog.Argv) > 1 {
		t.args = knownArgs(prog.Argv[1:])
	}
	d := c.decideTarget(t)
	if multiCall[t.name] || multiCall[t.argv0] {
		if len(prog.Argv) > 1 && !strings.HasPrefix(prog.Argv[1], "-") {
			// The applet's code is the binary's: its path is the binary's.
			applet := target{atExec: true, path: t.path, name: path.Base(prog.Argv[1]), args: knownArgs(prog.Argv[2:])}
			if ad := c.decideTarget(applet); ad.Action.Stricter(d.Action) {
				d = ad
			}
		}
	}
	return d
}

// NeedsSHA256 reports whether a rule names a program by its content, so
// that whoever decides program starts must give Program a SHA256
// function (a rule cannot match a program whose hash it is not given).
func (p *Exec) NeedsSHA256() bool {
	return slices.ContainsFunc(p.Rules, func(r ExecRule) bool { return strings.TrimSpace(r.SHA256) != "" })
}

// multiCall are binaries whose first argument names the program they act
// as.
var multiCall = map[string]bool{"busybox": true, "toybox": true}

func knownArgs(words []string) []arg {
	args := make([]arg, len(words))
	for i, w := range words {
		args[i] = arg{text: w, src: w}
	}
	return args
}

func onceHash(f func() (string, error)) func() (string, error) {
	if f == nil {
		return nil
	}
	var (
		done bool
		sum  string
		err  error
	)
	return func() (string, error) {
		if !done {
			sum, err = f()
			done = true
		}
		return sum, err
	}
}

// Checker is an execution policy made ready to decide many commands: its
// text patterns compiled and its argument patterns split. Build it once
// per policy version with Compile; it is safe for concurrent use.
type Checker struct {
	p     Exec
	rules []rule
	// parsers are shell parsers to reuse: a parser is not safe for
	// concurrent use, and making one costs more than a short line's parse.
	parsers sync.Pool
}

type rule struct {
	ExecRule
	index int
	args  []string       // Args split into words
	text  *regexp.Regexp // Text compiled
}

// Compile readies p for deciding commands. It fails only when a text
// pattern does not compile (Validate reports that, and more).
func (p *Exec) Compile() (*Checker, error) {
	c := p.checker()
	for i := range c.rules {
		r := &c.rules[i]
		if r.Text == "" {
			continue
		}
		re, err := regexp.Compile(r.Text)
		if err != nil {
			return nil, &PolicyError{Message: "Rule " + strconv.Itoa(i+1) + ": the text pattern does not compile: " + err.Error() + "."}
		}
		r.text = re
	}
	return c, nil
}

// checker copies p (normalized, so an unset default means allow) without
// compiling text patterns.
func (p *Exec) checker() *Checker {
	q := *p
	q.ExecPaths = slices.Clone(p.ExecPaths)
	q.Normalize()
	q.Default = q.Default.or(Allow)
	q.Dynamic = q.Dynamic.or(Ask)
	c := &Checker{p: q, rules: make([]rule, len(q.Rules))}
	for i, r := range q.Rules {
		r.Action = r.Action.or(Deny)
		c.rules[i] = rule{ExecRule: r, index: i, args: strings.Fields(r.Args)}
	}
	return c
}

// Policy is the (normalized) policy c decides by.
func (c *Checker) Policy() Exec { return c.p }

// PolicyError is a policy that cannot be applied; the console validates
// policies when they are saved, so it means a stored policy is damaged.
type PolicyError struct{ Message string }

func (e *PolicyError) Error() string { return "The execution policy is invalid: " + e.Message }

// target is a program as far as it is known: at exec time all of it, at
// the gateway what the command line says.
type target struct {
	name string // base name; "" when unknown
	path string // cleaned absolute path; "" when not written as one
	args []arg
	// unknown says why the program is not known before it runs.
	unknown string
	// builtin: a shell builtin run by the shell itself, so the default
	// does not apply (only rules naming it).
	builtin bool
	// argv0 is argv[0]'s base name where it differs from name (exec time).
	argv0  string
	atExec bool
	hash   func() (string, error)
}

type match int

const (
	noMatch match = iota
	mayMatch
	sureMatch
)

// matchTarget says whether r applies to t, and when it may but is not
// sure to, why. What only the place a program starts can know (which
// file a name found on PATH or a relative path is, a file's content) the
// gateway reads leniently: an allow rule applies, a deny or ask rule is
// left to agentd, which applies every rule there (note says so). At exec
// time the same gaps (a busybox applet has no path) read strictly.
func (r *rule) matchTarget(t target) (m match, why, note string) {
	m = sureMatch
	lower := func(n match, w string) {
		if n < m {
			m = n
		}
		if n == mayMatch && why == "" {
			why = w
		}
	}
	// atStart: the rule turns on what agentd sees where the program starts.
	atStart := func(what string) bool {
		if t.atExec {
			return r.Action != Allow
		}
		if r.Action != Allow {
			return false
		}
		note = " (" + what + " is checked where it starts)"
		return true
	}
	switch {
	case t.unknown != "":
		lower(mayMatch, t.unknown)
	case r.Program == "":
	case strings.Contains(r.Program, "/"):
		switch {
		case t.path != "":
			if ok, _ := path.Match(r.Program, t.path); !ok {
				return noMatch, "", ""
			}
		case t.name == "":
			return noMatch, "", ""
		default:
			if ok, _ := path.Match(path.Base(r.Program), t.name); !ok || !atStart("its path") {
				return noMatch, "", ""
			}
		}
	default:
		ok, _ := path.Match(r.Program, t.name)
		if !ok && t.argv0 != "" && r.Action != Allow {
			ok, _ = path.Match(r.Program, t.argv0)
		}
		if !ok {
			return noMatch, "", ""
		}
	}
	if r.SHA256 != "" && t.unknown == "" {
		switch {
		case !t.atExec:
			if !atStart("its content") {
				return noMatch, "", ""
			}
		case t.hash == nil:
			return noMatch, "", ""
		default:
			sum, err := t.hash()
			// A program that cannot be hashed is one the rule may name:
			// deny and ask rules apply, allow rules do not.
			if err != nil && r.Action == Allow || err == nil && !strings.EqualFold(sum, r.SHA256) {
				return noMatch, "", ""
			}
		}
	}
	if len(r.args) > 0 && t.unknown == "" {
		switch {
		case matchArgs(r.args, t.args, false):
		case matchArgs(r.args, t.args, true):
			lower(mayMatch, "its arguments "+unknownArgs(t.args)+" are known only when it runs")
		default:
			return r.matchGitArgs(t, m, why, note)
		}
	}
	return m, why, note
}

// matchGitArgs matches a deny or ask rule's args against git's arguments
// without its global options (git -C . push is git push), after they did
// not match as written: an option before the subcommand must not hide it.
// An option git may have that the gateway does not know makes the rule
// one that may apply. Allow rules match only the arguments as written,
// since options such as -c can change what the subcommand runs.
func (r *rule) matchGitArgs(t target, m match, why, note string) (match, string, string) {
	if r.Action == Allow || !t.isGit() {
		return noMatch, "", ""
	}
	rest, stripped, unknown := gitSubcommand(t.args)
	switch {
	case unknown != "":
		if why == "" {
			why = unknown
		}
		return mayMatch, why, note
	case !stripped:
		return noMatch, "", ""
	case matchArgs(r.args, rest, false):
		return m, why, note
	case matchArgs(r.args, rest, true):
		if why == "" {
			why = "its arguments " + unknownArgs(rest) + " are known only when it runs"
		}
		return mayMatch, why, note
	}
	return noMatch, "", ""
}

func unknownArgs(args []arg) string {
	var parts []string
	for _, a := range args {
		if a.unknown {
			parts = append(parts, "`"+a.src+"`")
		}
	}
	if len(parts) > 3 {
		parts = append(parts[:3], "…")
	}
	return strings.Join(parts, ", ")
}

// describe is a rule as one line: "deny program rm args -rf *".
func (r ExecRule) describe() string {
	parts := []string{string(r.Action)}
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

type candidate struct {
	action Action
	rule   int
	note   string
	why    string // for a rule that may apply: why it is not sure to
}

// ruleWhy is the Why of a decision taken by (or open because of) the
// rule a candidate names.
func (c *Checker) candidateWhy(x *candidate, sure bool) string {
	r := &c.rules[x.rule]
	if sure {
		return ruleWhy(x.rule, r.describe(), r.Reason) + x.note
	}
	return "rule " + strconv.Itoa(x.rule+1) + " (" + r.describe() + ") may apply: " + x.why
}

// decideTarget applies the rules to t: the strictest rule that surely
// applies wins, else the default. Where a rule may apply but it is not
// known before the program runs (an unknown program, unknown arguments),
// the outcome lies between the least and the strictest of the possible
// ones, and the dynamic setting picks within those bounds: so an unknown
// is never decided more leniently than every possible outcome, nor more
// strictly.
func (c *Checker) decideTarget(t target) Decision {
	base := candidate{action: c.p.Default, rule: -1, why: "the default (no rule matches)"}
	if t.builtin {
		base = candidate{action: Allow, rule: -1, why: "the default for shell builtins (" + t.name + " runs in the shell and starts no program)"}
	}
	var sure, mayHi, mayLo candidate
	hasSure, hasMay := false, false
	for i := range c.rules {
		r := &c.rules[i]
		if r.Text != "" {
			continue
		}
		m, why, note := r.matchTarget(t)
		switch m {
		case sureMatch:
			if !hasSure || r.Action.Stricter(sure.action) {
				sure, hasSure = candidate{action: r.Action, rule: i, note: note}, true
			}
		case mayMatch:
			cand := candidate{action: r.Action, rule: i, why: why}
			if !hasMay || r.Action.Stricter(mayHi.action) {
				mayHi = cand
			}
			if !hasMay || mayLo.action.Stricter(r.Action) {
				mayLo = cand
			}
			hasMay = true
		}
	}
	var d Decision
	switch {
	case !hasMay && hasSure:
		d = Decision{Action: sure.action, Rule: sure.rule, Why: c.candidateWhy(&sure, true)}
	case !hasMay:
		d = Decision{Action: base.action, Rule: -1, Why: base.why}
	default:
		var lo, hi Action
		if hasSure {
			lo, hi = sure.action, strictest(sure.action, mayHi.action)
		} else {
			lo, hi = leastStrict(base.action, mayLo.action), strictest(base.action, mayHi.action)
		}
		if lo == hi {
			// Every possible outcome is the same.
			if hasSure {
				d = Decision{Action: sure.action, Rule: sure.rule, Why: c.candidateWhy(&sure, true)}
			} else {
				d = Decision{Action: base.action, Rule: -1, Why: base.why}
			}
			break
		}
		act := c.p.Dynamic
		why := "the dynamic setting (" + string(act) + "): "
		if t.unknown != "" {
			why += t.unknown
		} else {
			why += c.candidateWhy(&mayHi, false)
		}
		switch {
		case act.Stricter(hi):
			act = hi
			why += "; but no possible outcome is stricter than " + string(hi)
		case lo.Stricter(act):
			act = lo
			why += "; but every possible outcome is at least " + string(lo)
		}
		d = Decision{Action: act, Rule: -1, Why: why}
	}
	if t.path != "" && len(c.p.ExecPaths) > 0 && !underAny(t.path, c.p.ExecPaths) {
		d = Decision{Action: Deny, Rule: -1, Why: "the exec paths (" + t.path + " is outside " + strings.Join(c.p.ExecPaths, ", ") + ")"}
	}
	return d
}

func strictest(a, b Action) Action {
	if b.Stricter(a) {
		return b
	}
	return a
}

func leastStrict(a, b Action) Action {
	if a.Stricter(b) {
		return b
	}
	return a
}

func underAny(p string, dirs []string) bool {
	for _, d := range dirs {
		if d == "/" || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}
