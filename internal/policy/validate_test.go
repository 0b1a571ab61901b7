package policy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/policy"
)

// fields returns the field errors of err, which must be a validation
// error or nil.
func fields(t *testing.T, err error) map[string]string {
	t.Helper()
	if err == nil {
		return nil
	}
	var ve *apperr.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v is not an *apperr.ValidationError", err)
	}
	return ve.Fields
}

func TestValidateExec(t *testing.T) {
	t.Parallel()
	rules := func(rs ...policy.ExecRule) policy.Exec {
		p := policy.DefaultExec()
		p.Rules = rs
		return p
	}
	many := make([]policy.ExecRule, policy.MaxExecRules+1)
	for i := range many {
		many[i] = policy.ExecRule{Action: policy.Deny, Program: "x"}
	}
	for _, tc := range []struct {
		name  string
		p     policy.Exec
		field string // "" when valid
		has   string
	}{
		{"the default policy", policy.DefaultExec(), "", ""},
		{"an empty policy (normalized to the default)", policy.Exec{}, "", ""},
		{"a full policy", policy.Exec{Default: policy.Deny, Dynamic: policy.Deny, ApprovalTimeoutSeconds: 60, RequireEnforcement: true, ExecPaths: []string{"/usr/bin"},
			Rules: []policy.ExecRule{
				{Action: policy.Allow, Program: "git", Args: "* [a-z]* ?", Reason: "work"},
				{Action: policy.Allow, Program: "/usr/bin/*"},
				{Action: policy.Ask, SHA256: strings.Repeat("0f", 32)},
				{Action: policy.Deny, Text: `rm\s`},
			}}, "", ""},
		{"a default that is no action", policy.Exec{Default: "block"}, "default", `not "block"`},
		{"a dynamic setting that is no action", policy.Exec{Dynamic: "sometimes"}, "dynamic", "must be ask, deny or allow"},
		{"a timeout too short", policy.Exec{ApprovalTimeoutSeconds: 59}, "approval_timeout_seconds", "between 60 and 86400"},
		{"a timeout too long", policy.Exec{ApprovalTimeoutSeconds: 86401}, "approval_timeout_seconds", "not 86401"},
		{"exec paths without default deny", policy.Exec{ExecPaths: []string{"/usr/bin"}}, "exec_paths", "default deny"},
		{"a relative exec path", policy.Exec{Default: policy.Deny, ExecPaths: []string{"bin"}}, "exec_paths[0]", `"bin"`},
		{"an exec path with ..", policy.Exec{Default: policy.Deny, ExecPaths: []string{"/usr/../tmp"}}, "exec_paths[0]", "absolute"},
		{"too many rules", rules(many...), "rules", "At most 200 rules"},
		{"a rule naming nothing", rules(policy.ExecRule{Action: policy.Deny}, policy.ExecRule{Action: policy.Deny, Args: "x"}), "rules[0].program", "Rule 1: program and sha256 are both empty"},
		{"args without a program", rules(policy.ExecRule{Action: policy.Deny, Program: "a"}, policy.ExecRule{Action: policy.Deny, Args: "x"}), "rules[1].program", "Rule 2: program and sha256 are both empty"},
		{"an action that is none", rules(policy.ExecRule{Action: "nope", Program: "x"}), "rules[0].action", `Rule 1: the action must be allow, ask or deny, not "nope"`},
		{"a missing action", rules(policy.ExecRule{Program: "x"}), "rules[0].action", "Rule 1"},
		{"a program glob that does not compile", rules(policy.ExecRule{Action: policy.Deny, Program: "r[m"}), "rules[0].program", "not a valid glob"},
		{"a relative program path", rules(policy.ExecRule{Action: policy.Deny, Program: "bin/rm"}), "rules[0].program", "absolute path"},
		{"a program path with ..", rules(policy.ExecRule{Action: policy.Deny, Program: "/usr/../rm"}), "rules[0].program", `".."`},
		{"an args glob that does not compile", rules(policy.ExecRule{Action: policy.Deny, Program: "rm", Args: "-rf [x"}), "rules[0].args", `"[x"`},
		{"a sha256 that is not one", rules(policy.ExecRule{Action: policy.Deny, SHA256: "abc"}), "rules[0].sha256", "64 hexadecimal digits"},
		{"a text pattern that does not compile", rules(policy.ExecRule{Action: policy.Deny, Text: "rm("}), "rules[0].text", "not a valid regular expression"},
		{"a text pattern with a program", rules(policy.ExecRule{Action: policy.Deny, Text: "rm", Program: "rm"}), "rules[0].text", "stands alone"},
		{"a text pattern that allows", rules(policy.ExecRule{Action: policy.Allow, Text: "git"}), "rules[0].action", "can only deny or ask"},
		{"a reason too long", rules(policy.ExecRule{Action: policy.Deny, Program: "x", Reason: strings.Repeat("x", policy.MaxReason+1)}), "rules[0].reason", "at most 500"},
		{"a program too long", rules(policy.ExecRule{Action: policy.Deny, Program: strings.Repeat("x", policy.MaxPattern+1)}), "rules[0].program", "at most 500"},
	} {
		got := fields(t, tc.p.Validate())
		switch {
		case tc.field == "" && got != nil:
			t.Errorf("%s: invalid: %v", tc.name, got)
		case tc.field != "" && !strings.Contains(got[tc.field], tc.has):
			t.Errorf("%s: fields %q, want %s to say %q", tc.name, got, tc.field, tc.has)
		}
	}
}

func TestParseExec(t *testing.T) {
	t.Parallel()
	v := apperr.Validation()
	if p := policy.ParseExec("  ", v, "exec_policy"); p.Digest() != policy.DefaultExec().Digest() || v.Err() != nil {
		t.Errorf("an empty document: %+v, %v", p, v.Err())
	}
	v = apperr.Validation()
	p := policy.ParseExec(`{"default":"DENY","rules":[{"action":"allow","program":"git"},{"action":"deny"}]}`, v, "exec_policy")
	if p.Default != policy.Deny || p.Dynamic != policy.Ask || p.ApprovalTimeoutSeconds != 600 {
		t.Errorf("not normalized: %+v", p)
	}
	if msg := v.Fields["exec_policy.rules[1].program"]; !strings.HasPrefix(msg, "Rule 2: ") {
		t.Errorf("fields %q", v.Fields)
	}
	for raw, has := range map[string]string{
		`{"default":"allow","rulez":[]}`: "Allowed fields",
		`{"default":`:                    "JSON",
		`{"rules":{}}`:                   "must be",
		`{} {}`:                          "single JSON object",
	} {
		v := apperr.Validation()
		policy.ParseExec(raw, v, "exec_policy")
		if !strings.Contains(v.Fields["exec_policy"], has) {
			t.Errorf("%s: fields %q, want exec_policy to say %q", raw, v.Fields, has)
		}
	}
}
