package policy_test

import (
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/policy"
)

// A git rule's args meet the subcommand, whatever global options come
// before it, at the gateway and at exec time; an option the gateway does
// not know leaves the subcommand to the dynamic setting.
func TestGitGlobalOptionsDoNotHideTheSubcommand(t *testing.T) {
	t.Parallel()
	p := policy.Exec{Default: policy.Allow, Dynamic: policy.Ask, Rules: []policy.ExecRule{
		{Action: policy.Deny, Program: "git", Args: "push *"},
	}}
	allowStatus := policy.Exec{Default: policy.Deny, Dynamic: policy.Ask, Rules: []policy.ExecRule{
		{Action: policy.Allow, Program: "git", Args: "status"},
	}}
	for _, tc := range []struct {
		p    policy.Exec
		line string
		want policy.Action
		rule int
	}{
		{p, "git push", policy.Deny, 0},
		{p, "git -C . push", policy.Deny, 0},
		{p, "git -c x=y push", policy.Deny, 0},
		{p, "git --git-dir=/w/.git push", policy.Deny, 0},
		{p, "git --git-dir /w/.git push origin main", policy.Deny, 0},
		{p, "git --no-pager push", policy.Deny, 0},
		{p, "git -P push", policy.Deny, 0},
		{p, "git -p push", policy.Deny, 0},
		{p, "git --paginate push", policy.Deny, 0},
		{p, "git --work-tree /w push", policy.Deny, 0},
		{p, "git --work-tree=/w --namespace=n push", policy.Deny, 0},
		{p, "git --namespace n --bare --no-replace-objects --literal-pathspecs push", policy.Deny, 0},
		{p, "git --exec-path=/x --config-env=a.b=ENV push", policy.Deny, 0},
		{p, "git --config-env a.b=ENV -C /w -c a=b -C x push -f", policy.Deny, 0},
		{p, "git -- push", policy.Deny, 0},
		{p, "/usr/bin/git -C . push", policy.Deny, 0},
		{p, "sudo git -C . push", policy.Deny, 0},
		{p, "git -C . status", policy.Allow, -1},
		{p, "git -c push=1 status", policy.Allow, -1},
		{p, "git --frobnicate push", policy.Ask, -1},
		{p, "git -C . --frobnicate status", policy.Ask, -1},
		{p, "git -C $DIR push", policy.Deny, 0},
		{allowStatus, "git status", policy.Allow, 0},
		{allowStatus, "git -c core.fsmonitor=x status", policy.Deny, -1},
	} {
		d, err := tc.p.DecideCommand(tc.line, nil)
		if err != nil {
			t.Fatalf("%q: %v", tc.line, err)
		}
		if d.Action != tc.want || d.Rule != tc.rule {
			t.Errorf("DecideCommand %q = %s by rule %d (%s), want %s by %d", tc.line, d.Action, d.Rule, d.Explain(), tc.want, tc.rule)
		}
		if strings.ContainsAny(tc.line, "$") || strings.HasPrefix(tc.line, "sudo") {
			continue
		}
		argv := strings.Fields(tc.line)
		pd := tc.p.DecideProgram(policy.Program{Path: "/usr/bin/git", Argv: argv})
		if pd.Action != tc.want || pd.Rule != tc.rule {
			t.Errorf("DecideProgram %q = %s by rule %d (%s), want %s by %d", argv, pd.Action, pd.Rule, pd.Why, tc.want, tc.rule)
		}
	}
}
