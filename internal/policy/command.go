package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"mvdan.cc/sh/v3/syntax"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// CommandDecision is the outcome of checking one command line: the
// overall decision (the strictest of everything found), what it applied
// to, and everything found, each with its own decision.
type CommandDecision struct {
	// Decision is the overall one. Its Rule and Why are those of the
	// deciding command or text rule.
	Decision
	// Line is the command line as given.
	Line string
	// Command is what the decision applied to: nil when a text rule
	// decided, or when the line runs no program (then it is allowed).
	Command *Command
	// Commands are every simple command found, in the order they appear,
	// those run by shells and wrappers after the wrapper itself, and what
	// runs but cannot be known before it does.
	Commands []Command
	// Texts are the text rules that match the line or the request's
	// environment.
	Texts []TextMatch
}

// Command is one simple command found on a line, as the shell would run
// it, with its decision.
type Command struct {
	// Text is the command as written.
	Text string
	// Program is the program as resolved: its name, or its path cleaned
	// (a relative one starts with ./ or ../); as written when it is known
	// only at run time.
	Program string
	// Name is the base name the rules match; "" when not known.
	Name string
	// Args are the arguments as resolved; those known only at run time as
	// written.
	Args []string
	// Via are the shells, wrappers and substitutions it runs inside,
	// outermost first: "sudo", "bash -c", "$(…)".
	Via []string
	// Unknown says what is known only at run time and why it matters;
	// "" when everything the rules look at is known.
	Unknown string
	Decision
}

// TextMatch is a text rule that matches the line or an env variable.
type TextMatch struct {
	// On is what it matched: "the command" or "the env variable NAME".
	On string
	Decision
}

// ParseError is a command line the shell parser rejects; the command is
// refused with Message. As an error it unwraps to an apperr.Error of kind
// ErrInvalid (code command_unparsable), so the console can return it as
// it is.
type ParseError struct {
	// Line and Column locate the problem (1-based; 0 when unknown).
	Line, Column int
	// Message is the parser's message.
	Message string
}

func (e *ParseError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("The command does not parse as a shell command line (line %d, column %d: %s).", e.Line, e.Column, e.Message)
	}
	return "The command does not parse as a shell command line (" + e.Message + ")."
}

// Unwrap makes the error an invalid-input apperr.Error.
func (e *ParseError) Unwrap() error {
	return &apperr.Error{Kind: apperr.ErrInvalid, Code: "command_unparsable", Message: e.Error()}
}

func newParseError(err error) *ParseError {
	var pe syntax.ParseError
	if errors.As(err, &pe) {
		return &ParseError{Line: int(pe.Pos.Line()), Column: int(pe.Pos.Col()), Message: pe.Text}
	}
	var le syntax.LangError
	if errors.As(err, &le) {
		return &ParseError{Line: int(le.Pos.Line()), Column: int(le.Pos.Col()), Message: le.Error()}
	}
	return &ParseError{Message: err.Error()}
}

func parseMessage(err error) string {
	pe := newParseError(err)
	if pe.Line > 0 {
		return fmt.Sprintf("line %d, column %d: %s", pe.Line, pe.Column, pe.Message)
	}
	return pe.Message
}

// DecideCommand checks a command line before it runs; see
// Checker.DecideCommand. It compiles p each time: callers deciding many
// lines against one policy should Compile once.
func (p *Exec) DecideCommand(line string, env map[string]string) (CommandDecision, error) {
	c, err := p.Compile()
	if err != nil {
		return CommandDecision{}, err
	}
	return c.DecideCommand(line, env)
}

// DecideCommand checks a command line before it runs, as the gateway
// does for every exec: the line is parsed as the shell would, every
// simple command in it (and in the shells and wrappers it runs) is
// decided by the rules, text rules are matched against the line and each
// env variable (as NAME=value and as the value alone), and the strictest
// outcome wins. env is the environment the request sets for the command.
// A line the parser rejects returns a *ParseError and must be refused.
func (c *Checker) DecideCommand(line string, env map[string]string) (CommandDecision, error) {
	if len(line) > MaxCommandBytes {
		return CommandDecision{}, &ParseError{Message: fmt.Sprintf("the command is longer than %d bytes", MaxCommandBytes)}
	}
	w := newWalker(c)
	defer w.done()
	f, err := w.parse(line)
	if err != nil {
		return CommandDecision{}, newParseError(err)
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	top := &scope{src: line}
	for _, k := range keys {
		// Shown by name only: an env value may hold a secret, and what is
		// decided is said in answers and the audit log.
		src := k + "=…"
		if why := runsCode(k); why != "" {
			w.dynamic(top, src, "the request's environment sets "+k+", which "+why)
		}
		w.subscript(word{text: env[k], src: src}, top)
	}
	w.file(f, top)
	d := CommandDecision{Line: line, Commands: w.out}
	for i := range c.rules {
		r := &c.rules[i]
		if r.text == nil {
			continue
		}
		on := ""
		if r.text.MatchString(line) {
			on = "the command"
		} else {
			for _, k := range keys {
				if r.text.MatchString(env[k]) || r.text.MatchString(k+"="+env[k]) {
					on = "the env variable " + k
					break
				}
			}
		}
		if on != "" {
			d.Texts = append(d.Texts, TextMatch{On: on, Decision: Decision{Action: r.Action, Rule: i, Why: ruleWhy(i, r.describe(), r.Reason) + " on " + on}})
		}
	}
	d.Decision = Decision{Action: Allow, Rule: -1, Why: "the line, which runs no program"}
	found := false
	// The strictest wins; between equals, the first decided by a rule
	// (it says more than a default or the dynamic setting).
	better := func(x Decision) bool {
		return !found || x.Action.Stricter(d.Action) || x.Action == d.Action && d.Rule < 0 && x.Rule >= 0
	}
	for i := range d.Commands {
		if cmd := &d.Commands[i]; better(cmd.Decision) {
			d.Decision, d.Command, found = cmd.Decision, cmd, true
		}
	}
	for _, t := range d.Texts {
		if better(t.Decision) {
			d.Decision, d.Command, found = t.Decision, nil, true
		}
	}
	return d, nil
}

// Explain says in a sentence what decided the line and on what, for the
// "try a command" box and for a refusal:
// "`rm -rf x` (inside `bash -c`) is denied by rule 2: deny program rm."
func (d CommandDecision) Explain() string {
	if d.Command != nil {
		return d.Command.Explain()
	}
	return "`" + shorten(d.Line, 120) + "` " + d.Action.verb() + " by " + d.Why + "."
}

// Explain says in a sentence how c is decided and why.
func (c Command) Explain() string {
	via := ""
	if len(c.Via) > 0 {
		via = " (inside `" + strings.Join(c.Via, "`, then `") + "`)"
	}
	return "`" + shorten(c.Text, 120) + "`" + via + " " + c.Action.verb() + " by " + c.Why + "."
}

// verb is how an explanation says a decided: "is denied".
func (a Action) verb() string {
	switch a {
	case Deny:
		return "is denied"
	case Ask:
		return "is held for approval"
	default:
		return "is allowed"
	}
}

// DecideInteractive decides an interactive shell an agent runtime types
// into: it runs programs known only when they run, so with any rule that
// denies or asks (text rules too: what is typed is text), or a default
// that is not allow, the dynamic setting decides; else it is allowed.
func (c *Checker) DecideInteractive() CommandDecision {
	p := c.Policy()
	d := CommandDecision{Line: "an interactive shell"}
	d.Action, d.Rule, d.Why = Allow, -1, "no rule refuses or asks about anything"
	restrictive := p.Default != Allow
	for _, r := range p.Rules {
		restrictive = restrictive || r.Action != Allow
	}
	if restrictive {
		d.Action, d.Why = p.Dynamic, "the dynamic setting ("+string(p.Dynamic)+"): what is typed is known only when it runs"
	}
	return d
}
