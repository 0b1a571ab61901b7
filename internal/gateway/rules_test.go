package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/policy"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// rulesTarget is a session whose agent carries p, stored as the agents
// service stores it.
func rulesTarget(p policy.Exec) sessions.Target {
	a := agents.Agent{ID: 3, Name: "coder", ExecPolicy: string(p.Canonical()), ExecPolicyDigest: p.Digest()}
	return sessions.Target{Session: sessions.Session{ID: 9}, Agent: a}
}

func rulesPolicy() policy.Exec {
	p := policy.DefaultExec()
	p.Rules = []policy.ExecRule{
		{Action: policy.Deny, Program: "rm", Reason: "deleting needs a person"},
		{Action: policy.Ask, Program: "git", Args: "push *"},
		{Action: policy.Deny, Text: "^shutdown", Reason: policy.MigratedReason},
	}
	return p
}

type fakeAsker struct{ got []AskRequest }

func (f *fakeAsker) Ask(_ context.Context, r AskRequest) (Output, error) {
	f.got = append(f.got, r)
	return Output{State: "pending"}, nil
}

// TestExecRules: what the gateway answers for each decision of the
// agent's execution rules, and what a denial records.
func TestExecRules(t *testing.T) {
	t.Parallel()
	tg := rulesTarget(rulesPolicy())
	for _, tc := range []struct {
		name, command string
		env           map[string]string
		interactive   bool
		key           bool   // the caller is an API key
		code          string // "" allowed
		kind          error
		rule          string // in the recorded denial
	}{
		{name: "allowed", command: "ls -la && git status"},
		{name: "denied through bash -c", command: "bash -c 'rm -rf x'", code: "forbidden", kind: apperr.ErrForbidden, rule: "rule 1: deny program rm"},
		{name: "denied by a text rule on env", command: `eval "$X"`, env: map[string]string{"X": "shutdown now"}, code: "forbidden", kind: apperr.ErrForbidden, rule: "env variable X"},
		{name: "ask without an asker", command: "git push origin main", code: CodeApprovalRequired, kind: apperr.ErrForbidden, rule: "rule 2: ask program git args push *"},
		{name: "dynamic ask", command: "$(printf rm) x", code: CodeApprovalRequired, kind: apperr.ErrForbidden, rule: "dynamic"},
		{name: "unparsable", command: "echo 'unterminated", code: "command_unparsable", kind: apperr.ErrInvalid},
		{name: "terminal shell not decided", command: "rm -rf x", interactive: true},
		{name: "an API key's shell is decided as dynamic", command: "rm -rf x", interactive: true, key: true,
			code: CodeApprovalRequired, kind: apperr.ErrForbidden, rule: "An API key's interactive shell"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := &Gateway{}
			p := authz.Principal{Kind: "user", ID: "1", Name: "u"}
			if tc.key {
				p.Kind = audit.ActorAPIKey
			}
			a := authz.New(p, nil, nil)
			req := ExecRequest{Command: tc.command, Env: tc.env}
			if tc.interactive {
				req = req.Interactive()
			}
			_, err := g.execRules(a, tg, req)
			if tc.code == "" {
				if err != nil || len(a.Denials()) != 0 {
					t.Fatalf("err = %v, denials %v; want allowed", err, a.Denials())
				}
				return
			}
			var ae *apperr.Error
			if !errors.As(err, &ae) || ae.Code != tc.code || !errors.Is(err, tc.kind) {
				t.Fatalf("err = %#v, want code %s", err, tc.code)
			}
			if tc.rule == "" {
				if len(a.Denials()) != 0 {
					t.Errorf("a parse error recorded a denial: %v", a.Denials())
				}
				return
			}
			ds := a.Denials()
			if len(ds) != 1 || !strings.Contains(ds[0].Rule, tc.rule) || !strings.Contains(ds[0].Rule, "version "+tg.Agent.ExecPolicyDigest[:12]) || ds[0].Action != ActExec {
				t.Errorf("denials = %+v, want one whose rule says %q and the version", ds, tc.rule)
			}
		})
	}
	t.Run("command.exec details", func(t *testing.T) {
		t.Parallel()
		d, _ := (&Gateway{}).execRules(authz.New(authz.Principal{Kind: "user"}, nil, nil), tg, ExecRequest{Command: "ls"})
		got := execPolicyDetails(tg, ExecRequest{Command: "ls"}, d)
		if got["version"] != tg.Agent.ExecPolicyDigest || got["action"] != policy.Allow {
			t.Errorf("details = %v", got)
		}
		if got := execPolicyDetails(tg, ExecRequest{Command: "sh"}.Interactive(), policy.CommandDecision{}); got["checked"] != false {
			t.Errorf("the terminal's shell details = %v", got)
		}
		// An API key's shell was decided: its event says by what.
		rp := rulesPolicy()
		c, _ := rp.Compile()
		if got := execPolicyDetails(tg, ExecRequest{Command: "sh"}.Interactive(), c.DecideInteractive()); got["version"] != tg.Agent.ExecPolicyDigest || got["action"] != policy.Ask {
			t.Errorf("an API key's shell details = %v", got)
		}
	})
	t.Run("asker takes ask", func(t *testing.T) {
		t.Parallel()
		g := &Gateway{Asker: &fakeAsker{}}
		a := authz.New(authz.Principal{Kind: "user", ID: "1", Name: "u"}, nil, nil)
		d, err := g.execRules(a, tg, ExecRequest{Command: "git push origin main"})
		if !errors.Is(err, errAsked) || d.Action != policy.Ask || d.Rule != 1 || len(a.Denials()) != 0 {
			t.Errorf("ask with an asker = %v, %+v, denials %v", err, d.Decision, a.Denials())
		}
	})
	t.Run("an API key's shell", func(t *testing.T) {
		t.Parallel()
		key := func() *authz.Actor {
			return authz.New(authz.Principal{Kind: audit.ActorAPIKey, ID: "7", Name: "runtime"}, nil, nil)
		}
		shell := ExecRequest{Command: "sh"}.Interactive()
		// With nothing the rules could refuse, a shell is what exec is.
		if _, err := (&Gateway{}).execRules(key(), rulesTarget(policy.DefaultExec()), shell); err != nil {
			t.Errorf("allow-all policy: %v", err)
		}
		// An asker does not take it: nobody can approve what will be typed.
		a := key()
		if _, err := (&Gateway{Asker: &fakeAsker{}}).execRules(a, tg, shell); !errors.Is(err, apperr.ErrForbidden) || len(a.Denials()) != 1 {
			t.Errorf("with an asker: %v, denials %v", err, a.Denials())
		}
		deny := rulesPolicy()
		deny.Dynamic = policy.Deny
		a = key()
		if _, err := (&Gateway{}).execRules(a, rulesTarget(deny), shell); !errors.Is(err, apperr.ErrForbidden) || len(a.Denials()) != 1 {
			t.Errorf("dynamic deny: %v, denials %v", err, a.Denials())
		}
	})
	t.Run("damaged policy fails closed", func(t *testing.T) {
		t.Parallel()
		bad := tg
		bad.Agent.ExecPolicy, bad.Agent.ExecPolicyDigest = "{", "x"
		a := authz.New(authz.Principal{Kind: "user", ID: "1", Name: "u"}, nil, nil)
		if _, err := (&Gateway{}).execRules(a, bad, ExecRequest{Command: "ls"}); err == nil {
			t.Error("a damaged policy allowed an exec")
		}
	})
}

// TestExecRulesCompileOncePerVersion: an edited policy (a new digest) is
// decided by its own rules at once; the old version's checker is not
// reused for it.
func TestExecRulesCompileOncePerVersion(t *testing.T) {
	t.Parallel()
	g := &Gateway{}
	a := authz.New(authz.Principal{Kind: "user", ID: "1", Name: "u"}, nil, nil)
	p := rulesPolicy()
	tg := rulesTarget(p)
	if _, err := g.execRules(a, tg, ExecRequest{Command: "ls"}); err != nil {
		t.Fatal(err)
	}
	p.Rules = append(p.Rules, policy.ExecRule{Action: policy.Deny, Program: "ls"})
	if _, err := g.execRules(a, rulesTarget(p), ExecRequest{Command: "ls"}); !errors.Is(err, apperr.ErrForbidden) {
		t.Errorf("the edited policy's new rule did not apply: %v", err)
	}
	if _, err := g.execRules(a, tg, ExecRequest{Command: "ls"}); err != nil {
		t.Errorf("the old version: %v", err)
	}
	if n := g.rules.n.Load(); n != 2 {
		t.Errorf("compiled %d times, want 2 (one per version)", n)
	}
}

// BenchmarkExecRules measures what the execution rules add to one exec
// of a typical one-line command: the agent's version, the compiled
// policy from the cache, the parse and the decision (p50-ns is the
// figure to compare with the 50 µs budget).
func BenchmarkExecRules(b *testing.B) {
	var p policy.Exec
	raw := `{"rules":[
		{"action":"deny","program":"rm","args":"* -*r* /*"},{"action":"deny","program":"shutdown"},{"action":"deny","program":"mkfs*"},
		{"action":"ask","program":"git","args":"push *"},{"action":"deny","program":"git","args":"push --force *"},
		{"action":"ask","program":"kubectl","args":"delete *"},{"action":"ask","program":"terraform","args":"apply *"},
		{"action":"deny","program":"/usr/sbin/*"},{"action":"allow","program":"go"},{"action":"deny","program":"nc"},
		{"action":"deny","text":"curl[^|]*\\|\\s*(ba)?sh","reason":"migrated command pattern"}]}`
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		b.Fatal(err)
	}
	tg := rulesTarget(p)
	g := &Gateway{}
	a := authz.New(authz.Principal{Kind: "user", ID: "1", Name: "u"}, nil, nil)
	req := ExecRequest{Command: "cd /work/repo && go test ./... 2>&1 | tail -n 50", Env: map[string]string{"CI": "1"}}
	b.ReportAllocs()
	took := make([]time.Duration, 0, 1<<16)
	for b.Loop() {
		start := time.Now()
		if _, err := g.execRules(a, tg, req); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	if len(took) > 0 {
		slices.Sort(took)
		b.ReportMetric(float64(took[len(took)/2].Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds()), "p99-ns")
	}
}
