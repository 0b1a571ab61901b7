package agents_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/policy"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestLegacyPatternsKeepDenying: an agent saved before execution policies
// (exec_policy empty) reads its command patterns as text deny rules that
// deny exactly the commands (and env values) the patterns denied.
func TestLegacyPatternsKeepDenying(t *testing.T) {
	t.Parallel()
	a := agents.Agent{ID: 7, CommandPolicy: `["^rm\\s+-rf\\s+/","(?i)shutdown","curl .*\\| *sh"]`}
	p, err := a.Exec()
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rules) != 3 || p.Rules[0].Text != `^rm\s+-rf\s+/` || p.Rules[0].Action != policy.Deny || p.Default != policy.Allow {
		t.Fatalf("legacy policy = %+v", p)
	}
	if a.ExecVersion() != p.Digest() || a.ExecVersion() == "" {
		t.Errorf("ExecVersion = %q, want the digest %q", a.ExecVersion(), p.Digest())
	}
	c, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		command string
		env     map[string]string
	}{
		{"rm -rf /", nil},
		{"rm  -rf /var", nil},
		{"echo rm -rf /", nil},
		{"sudo SHUTDOWN -h now", nil},
		{"curl https://x.sh | sh", nil},
		{"ls -la", nil},
		{`eval "$X"`, map[string]string{"X": "rm -rf /"}},
		{"env", map[string]string{"Y": "shutdown now"}},
	} {
		legacy := a.DeniedBy(tc.command) != ""
		for _, v := range tc.env {
			legacy = legacy || a.DeniedBy(v) != ""
		}
		d, err := c.DecideCommand(tc.command, tc.env)
		if err != nil {
			t.Fatalf("%q: %v", tc.command, err)
		}
		// The legacy patterns deny; nothing else does (the default
		// allows, and dynamic ask with no other rule allows too).
		if got := d.Action == policy.Deny; got != legacy {
			t.Errorf("%q env %v: denied %v by the migrated policy (%s), %v by the patterns", tc.command, tc.env, got, d.Explain(), legacy)
		}
	}
}

// TestExecPolicyStored: the service stores the execution policy
// canonical with its digest, converts legacy command_policy input into
// text deny rules, and names the rule in every validation message.
func TestExecPolicyStored(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d)
		ctx := context.Background()
		raw := `{"default":"ASK","rules":[{"action":"deny","program":" rm "},{"action":"ask","program":"git","args":"push  *","reason":"needs a person"}]}`
		in := base(w.host1.ID)
		in.ExecPolicy = &raw
		a, err := w.svc.Create(ctx, w.admin, in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := w.svc.Get(ctx, w.admin, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		p, err := got.Exec()
		if err != nil {
			t.Fatal(err)
		}
		if p.Default != policy.Ask || p.Dynamic != policy.Ask || p.ApprovalTimeoutSeconds != 600 || len(p.Rules) != 2 || p.Rules[0].Program != "rm" || p.Rules[1].Args != "push *" {
			t.Errorf("stored policy = %+v", p)
		}
		if got.ExecPolicyDigest != p.Digest() || got.ExecPolicy != string(p.Canonical()) || got.CommandPolicy != "[]" {
			t.Errorf("digest %q (want %q), policy %s, command_policy %s", got.ExecPolicyDigest, p.Digest(), got.ExecPolicy, got.CommandPolicy)
		}

		// Legacy input replaces the text deny rules and keeps the others.
		_, after, err := w.svc.Update(ctx, w.admin, a.ID, agents.Input{CommandPolicy: []string{"^shutdown", " "}})
		if err != nil {
			t.Fatal(err)
		}
		p2, _ := after.Exec()
		if len(p2.Rules) != 3 || p2.Rules[2].Text != "^shutdown" || p2.Rules[2].Reason != policy.MigratedReason || after.CommandPolicy != `["^shutdown"]` {
			t.Errorf("after command_policy: %+v, command_policy %s", p2.Rules, after.CommandPolicy)
		}
		if after.ExecPolicyDigest == got.ExecPolicyDigest {
			t.Error("a changed policy kept its digest")
		}
		_, after, err = w.svc.Update(ctx, w.admin, a.ID, agents.Input{CommandPolicy: []string{"^reboot"}})
		if err != nil {
			t.Fatal(err)
		}
		if pats := after.Policy(); len(pats) != 1 || pats[0] != "^reboot" {
			t.Errorf("command_policy replaced = %v", pats)
		}

		// Given together, the patterns are added to exec_policy's rules,
		// unless a text deny rule already says the same.
		both := `{"rules":[{"action":"deny","program":"rm"},{"action":"deny","text":"^x"}]}`
		_, after, err = w.svc.Update(ctx, w.admin, a.ID, agents.Input{ExecPolicy: &both, CommandPolicy: []string{"^x", "^y"}})
		if err != nil {
			t.Fatal(err)
		}
		if p3, _ := after.Exec(); len(p3.Rules) != 3 || p3.Rules[1].Text != "^x" || p3.Rules[2].Text != "^y" || after.CommandPolicy != `["^x","^y"]` {
			t.Errorf("exec_policy with command_policy: %+v, command_policy %s", p3.Rules, after.CommandPolicy)
		}

		// A legacy row (exec_policy empty) is read from its patterns and
		// stored as rules on its next save.
		if err := w.db.Exec("UPDATE agents SET exec_policy = '', exec_policy_digest = '', command_policy = ? WHERE id = ?", `["^halt"]`, a.ID).Error; err != nil {
			t.Fatal(err)
		}
		legacy, _ := w.svc.Get(ctx, w.admin, a.ID)
		if lp, _ := legacy.Exec(); len(lp.Rules) != 1 || lp.Rules[0].Text != "^halt" {
			t.Errorf("legacy read = %+v", lp.Rules)
		}
		_, saved, err := w.svc.Update(ctx, w.admin, a.ID, agents.Input{Description: ptr("d")})
		if err != nil {
			t.Fatal(err)
		}
		var stored policy.Exec
		if err := json.Unmarshal([]byte(saved.ExecPolicy), &stored); err != nil || len(stored.Rules) != 1 || stored.Rules[0].Text != "^halt" || saved.ExecPolicyDigest != legacy.ExecVersion() {
			t.Errorf("legacy saved = %s (%v), digest %q want %q", saved.ExecPolicy, err, saved.ExecPolicyDigest, legacy.ExecVersion())
		}
	})
}

// TestExecPolicyValidation: every refusal is a field error keyed by the
// rule ("exec_policy.rules[1].program") whose message names it ("Rule 2").
func TestExecPolicyValidation(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d)
		ctx := context.Background()
		for _, tc := range []struct {
			name, raw, field, want string
			patterns               []string
		}{
			{"unknown field", `{"rulez":[]}`, "exec_policy", "Allowed fields", nil},
			{"bad default", `{"default":"maybe"}`, "exec_policy.default", "allow, ask or deny", nil},
			{"bad dynamic", `{"dynamic":"sometimes"}`, "exec_policy.dynamic", "ask, deny or allow", nil},
			{"timeout too short", `{"approval_timeout_seconds":5}`, "exec_policy.approval_timeout_seconds", "between 60 and 86400", nil},
			{"rule without program", `{"rules":[{"action":"deny","program":"rm"},{"action":"deny"}]}`, "exec_policy.rules[1].program", "Rule 2: program and sha256 are both empty", nil},
			{"relative program", `{"rules":[{"action":"deny","program":"bin/rm"}]}`, "exec_policy.rules[0].program", "Rule 1: the program \"bin/rm\" has a slash", nil},
			{"bad action", `{"rules":[{"action":"nope","program":"rm"}]}`, "exec_policy.rules[0].action", "Rule 1: the action must be", nil},
			{"bad args glob", `{"rules":[{"action":"deny","program":"git","args":"[push"}]}`, "exec_policy.rules[0].args", "Rule 1: the args word", nil},
			{"text allow", `{"rules":[{"action":"allow","text":"^ls"}]}`, "exec_policy.rules[0].action", "Rule 1: a text pattern can only deny or ask", nil},
			{"bad text", `{"rules":[{"action":"deny","text":"("}]}`, "exec_policy.rules[0].text", "not a valid regular expression", nil},
			{"require enforcement", `{"require_enforcement":true}`, "exec_policy.require_enforcement", "not available yet", nil},
			{"exec paths", `{"default":"deny","exec_paths":["/usr/bin"]}`, "exec_policy.exec_paths", "not available yet", nil},
			{"bad legacy pattern", `{}`, "command_policy", "Pattern 1", []string{"("}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				in := base(w.host1.ID)
				in.Name = ptr("agent-" + strings.ReplaceAll(tc.name, " ", "-"))
				in.ExecPolicy = &tc.raw
				in.CommandPolicy = tc.patterns
				_, err := w.svc.Create(ctx, w.admin, in)
				var v *apperr.ValidationError
				if !errors.As(err, &v) {
					t.Fatalf("Create = %v, want a validation error", err)
				}
				if !strings.Contains(v.Fields[tc.field], tc.want) {
					t.Errorf("fields = %v, want %s to contain %q", v.Fields, tc.field, tc.want)
				}
			})
		}
	})
}
