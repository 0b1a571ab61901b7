package agents

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/policy"
)

// AllowRuleFor is the allow rule that lets command line run without
// asking on agent a: the program and the arguments of the one command on
// the line the agent's rules ask about, word for word. It refuses (a
// validation error on scope) what no allow rule can lift: a command a
// rule asks about (the strictest matching rule wins, so an allow rule
// would not change it), what is known only when it runs, and a line where
// more than one command asks.
func AllowRuleFor(a Agent, line, reason string) (policy.ExecRule, error) {
	refuse := func(format string, args ...any) (policy.ExecRule, error) {
		return policy.ExecRule{}, &apperr.ValidationError{Fields: map[string]string{"scope": fmt.Sprintf(format, args...)}}
	}
	p, err := a.Exec()
	if err != nil {
		return policy.ExecRule{}, err
	}
	d, err := p.DecideCommand(line, nil)
	if err != nil {
		return refuse("The command no longer parses: approve once or for the session.")
	}
	var asked []policy.Command
	for _, c := range d.Commands {
		if c.Action == policy.Ask {
			asked = append(asked, c)
		}
	}
	switch {
	case len(asked) == 0:
		return refuse("The agent's rules no longer ask about this command: approve once.")
	case len(asked) > 1:
		return refuse("More than one command on this line needs approval; one allow rule cannot cover them: approve once or for the session.")
	case asked[0].Unknown != "":
		return refuse("What this command runs is known only when it runs (%s), which no rule can name: approve once or for the session.", asked[0].Unknown)
	case asked[0].Rule >= 0:
		return refuse("Rule %d asks about this command, and the strictest matching rule wins, so an allow rule would not change it: approve once or for the session, or edit the agent's rules.", asked[0].Rule+1)
	}
	words := make([]string, 0, len(asked[0].Args))
	for _, w := range asked[0].Args {
		if w == "" || strings.ContainsAny(w, " \t\n") {
			return refuse("An argument of this command has spaces, which an args pattern cannot name: approve once or for the session.")
		}
		words = append(words, globEscaper.Replace(w))
	}
	return policy.ExecRule{Action: policy.Allow, Program: globEscaper.Replace(asked[0].Program), Args: strings.Join(words, " "), Reason: reason}, nil
}

var globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`)

// AddExecRule appends rule to agent id's execution policy in tx, the
// caller's transaction (an approval decided with scope "rule"), and
// returns the agent before and after; the caller audits the change.
func AddExecRule(ctx context.Context, tx *gorm.DB, id int64, rule policy.ExecRule, now time.Time) (before, after Agent, err error) {
	s := &Service{DB: tx}
	if before, err = s.load(ctx, id); err != nil {
		return
	}
	p, err := before.Exec()
	if err != nil {
		return
	}
	p.Rules = append(slices.Clone(p.Rules), rule)
	p.Normalize()
	v := apperr.Validation()
	p.ValidateInto(v, "exec_policy")
	if err = v.Err(); err != nil {
		return
	}
	after = before
	after.ExecPolicy, after.ExecPolicyDigest, after.UpdatedAt = string(p.Canonical()), p.Digest(), now.UTC()
	b, _ := json.Marshal(TextPatterns(p))
	after.CommandPolicy = string(b)
	err = tx.WithContext(ctx).Model(&Agent{}).Where("id = ?", id).Updates(map[string]any{"exec_policy": after.ExecPolicy,
		"exec_policy_digest": after.ExecPolicyDigest, "command_policy": after.CommandPolicy, "updated_at": after.UpdatedAt}).Error
	if err != nil {
		err = fmt.Errorf("add a rule to agent %d: %w", id, err)
	}
	return
}
