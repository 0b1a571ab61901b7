package handlers_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// corpusExecPolicy denies program rm (rule 2) among rules of the kinds
// agents carry; dynamic is left to its default, ask.
var corpusExecPolicy = map[string]any{"rules": []map[string]string{
	{"action": "allow", "program": "ls"},
	{"action": "deny", "program": "rm", "reason": "deleting files needs a person"},
	{"action": "ask", "program": "git", "args": "push *"},
}}

type corpusEntry struct {
	want, line string
	lineNo     int
}

// readExecCorpus reads testdata/exec_denied_corpus.txt: an outcome
// (deny or dynamic), blanks, the command line (↵ for a newline).
func readExecCorpus(t *testing.T) []corpusEntry {
	t.Helper()
	f, err := os.Open("testdata/exec_denied_corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []corpusEntry
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		text := sc.Text()
		if strings.TrimSpace(text) == "" || strings.HasPrefix(text, "#") {
			continue
		}
		want, line, ok := strings.Cut(text, " ")
		if !ok || want != "deny" && want != "dynamic" {
			t.Fatalf("exec_denied_corpus.txt:%d: want an outcome (deny or dynamic), then the line: %q", n, text)
		}
		out = append(out, corpusEntry{want: want, line: strings.ReplaceAll(strings.TrimLeft(line, " "), "↵", "\n"), lineNo: n})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) < 40 {
		t.Fatalf("the corpus has %d lines; the issue asks for at least 40", len(out))
	}
	return out
}

// agentJSONView is what these tests read of an agent.
type agentJSONView struct {
	CommandPolicy []string `json:"command_policy"`
	ExecPolicy    struct {
		Default         string `json:"default"`
		Dynamic         string `json:"dynamic"`
		ApprovalTimeout int    `json:"approval_timeout_seconds"`
		Rules           []struct {
			Action, Program, Args, Text, Reason string
		} `json:"rules"`
	} `json:"exec_policy"`
	ExecPolicyVersion string `json:"exec_policy_version"`
}

func (f *terminalFixture) agent(t *testing.T) agentJSONView {
	t.Helper()
	r := f.call(http.MethodGet, fmt.Sprintf("/agents/%d", f.agentID), "member", nil)
	wantStatus(t, "read the agent", r, http.StatusOK)
	var a agentJSONView
	r.decode(t, &a)
	return a
}

// TestExecPolicyCorpusThroughTheAPI: every shell form of running rm in
// the corpus, sent as a real exec through the console's API, is refused
// (denied, or held as dynamic) before the real agentd hears of it, and
// each denial is audited as authz.deny naming the rule and the policy's
// version.
func TestExecPolicyCorpusThroughTheAPI(t *testing.T) {
	t.Parallel()
	corpus := readExecCorpus(t)
	f := newTerminalFixture(t, store.SQLite)
	r := f.call(http.MethodPatch, fmt.Sprintf("/agents/%d", f.agentID), "entered-admin", map[string]any{"exec_policy": corpusExecPolicy})
	wantStatus(t, "set the execution policy", r, http.StatusOK)
	version := f.agent(t).ExecPolicyVersion
	// Bring the session up first, so the corpus counts only what the
	// refused execs would send.
	r = f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "ls", "wait_ms": 5000})
	wantStatus(t, "an allowed command runs", r, http.StatusCreated)
	waitFollowersIdle(t, f.e)

	before := f.agentd.requests.Load()
	denied := 0
	for _, c := range corpus {
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": c.line})
		if c.want == "dynamic" {
			// Held for a person: a pending approval request.
			if r.status != http.StatusAccepted || !strings.Contains(string(r.body), `"state":"pending"`) {
				t.Errorf("line %d %q: %d %s, want 202 pending", c.lineNo, c.line, r.status, r.body)
			}
		} else if denied++; r.status != http.StatusForbidden || r.envelope(t).Error.Code != "forbidden" {
			t.Errorf("line %d %q: %d %s, want 403 forbidden", c.lineNo, c.line, r.status, r.body)
		}
		if n := f.agentd.requests.Load(); n != before {
			t.Fatalf("line %d %q reached agentd: %v", c.lineNo, c.line, f.agentd.callsSince(int(before)))
		}
	}
	evs := orgEvents(t, f.orgFixture, "action:authz.deny")
	byRule := 0
	for _, ev := range evs {
		d := string(ev.Details)
		if strings.Contains(d, "rule 2: deny program rm") && strings.Contains(d, "version "+version[:12]) && strings.Contains(d, "deleting files needs a person") {
			byRule++
		}
	}
	// Every line denied is an authz.deny naming rule 2, its reason and
	// the policy's version; every line held, an approval request.
	if asked := len(orgEvents(t, f.orgFixture, "action:approval.requested")); byRule < denied || len(evs) < denied || asked < len(corpus)-denied {
		t.Errorf("%d authz.deny events (%d naming rule 2 and version %s), want %d; %d approval requests, want %d", len(evs), byRule, version[:12], denied, asked, len(corpus)-denied)
	}
}

// TestExecPolicyAPI: exec_policy through the API (validation naming the
// rule, legacy command_policy as text deny rules, the version), what an
// ask and an unparsable line answer, the try endpoint, and a legacy agent
// that keeps denying what its patterns denied.
func TestExecPolicyAPI(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		agentPath := fmt.Sprintf("/agents/%d", f.agentID)

		t.Run("legacy command_policy shows as a text deny rule", func(t *testing.T) {
			a := f.agent(t)
			if len(a.ExecPolicy.Rules) != 1 || a.ExecPolicy.Rules[0].Text != "^rm -rf /" || a.ExecPolicy.Rules[0].Action != "deny" ||
				len(a.CommandPolicy) != 1 || a.CommandPolicy[0] != "^rm -rf /" || len(a.ExecPolicyVersion) != 64 {
				t.Fatalf("agent created with command_policy = %+v", a)
			}
		})

		t.Run("validation names the rule", func(t *testing.T) {
			r := f.call(http.MethodPatch, agentPath, "entered-admin", map[string]any{"exec_policy": map[string]any{
				"default": "sometimes", "rules": []map[string]string{{"action": "deny", "program": "rm"}, {"action": "deny", "program": "bin/rm"}}}})
			wantStatus(t, "a bad policy", r, http.StatusBadRequest)
			e := r.envelope(t)
			if e.Error.Code != "validation_failed" || !strings.Contains(e.Error.Fields["exec_policy.rules[1].program"], "Rule 2:") ||
				!strings.Contains(e.Error.Fields["exec_policy.default"], "allow, ask or deny") {
				t.Fatalf("fields = %v", e.Error.Fields)
			}
		})

		var version string
		t.Run("set", func(t *testing.T) {
			old := f.agent(t).ExecPolicyVersion
			r := f.call(http.MethodPatch, agentPath, "entered-admin", map[string]any{"exec_policy": corpusExecPolicy})
			wantStatus(t, "set the policy", r, http.StatusOK)
			a := f.agent(t)
			version = a.ExecPolicyVersion
			if len(a.ExecPolicy.Rules) != 3 || a.ExecPolicy.Default != "allow" || a.ExecPolicy.Dynamic != "ask" || len(a.CommandPolicy) != 0 || version == old {
				t.Fatalf("after setting exec_policy: %+v (version was %s)", a, old)
			}
		})

		t.Run("ask is held as a pending approval and unparsable refused as command_unparsable, before agentd", func(t *testing.T) {
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo warm", "wait_ms": 5000})
			wantStatus(t, "warm", r, http.StatusCreated)
			waitFollowersIdle(t, f.e)
			// The exec's audit event says which version of the rules let
			// it run, and what decided.
			var exec struct {
				Command    string `json:"command"`
				ExecPolicy struct {
					Version, Action, Why string
				} `json:"exec_policy"`
			}
			found := false
			for _, ev := range orgEvents(t, f.orgFixture, "action:command.exec") {
				if err := json.Unmarshal(ev.Details, &exec); err == nil && exec.Command == "echo warm" {
					found = exec.ExecPolicy.Version == version && exec.ExecPolicy.Action == "allow" && strings.Contains(exec.ExecPolicy.Why, "default for shell builtins")
				}
			}
			if !found {
				t.Errorf("command.exec of echo warm does not carry the policy version %s: %+v", version, exec)
			}
			before := f.agentd.requests.Load()
			r = f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "git push origin main"})
			wantStatus(t, "ask", r, http.StatusAccepted)
			if b := string(r.body); !strings.Contains(b, `"state":"pending"`) || !strings.Contains(b, "rule 3") {
				t.Errorf("ask answered %s", b)
			}
			asked := false
			for _, ev := range orgEvents(t, f.orgFixture, "action:approval.requested") {
				d := string(ev.Details)
				asked = asked || strings.Contains(d, "rule 3: ask program git args push *") && strings.Contains(d, version)
			}
			if !asked {
				t.Error("the ask is not audited as approval.requested with the rule and the policy's version")
			}
			r = f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo 'unterminated"})
			wantStatus(t, "unparsable", r, http.StatusBadRequest)
			if e := r.envelope(t).Error; e.Code != "command_unparsable" || !strings.Contains(e.Message, "does not parse") {
				t.Errorf("unparsable answered %+v", e)
			}
			if n := f.agentd.requests.Load(); n != before {
				t.Errorf("agentd got %v", f.agentd.callsSince(int(before)))
			}
		})

		t.Run("try", func(t *testing.T) {
			r := f.call(http.MethodPost, agentPath+"/exec-policy/try", "member", map[string]any{"command": "ls && bash -c 'rm x'"})
			wantStatus(t, "try as a reader", r, http.StatusOK)
			var got struct {
				Action   string `json:"action"`
				Rule     *int   `json:"rule"`
				Explain  string `json:"explain"`
				Version  string `json:"exec_policy_version"`
				Commands []struct {
					Text, Program, Action string
					Via                   []string
					Rule                  *int
				} `json:"commands"`
			}
			r.decode(t, &got)
			if got.Action != "deny" || got.Rule == nil || *got.Rule != 1 || got.Version != version || !strings.Contains(got.Explain, "inside `bash -c`") ||
				len(got.Commands) != 3 || got.Commands[0].Program != "ls" || got.Commands[0].Action != "allow" ||
				got.Commands[2].Program != "rm" || len(got.Commands[2].Via) != 1 || got.Commands[2].Via[0] != "bash -c" {
				t.Errorf("try = %s", r.body)
			}
			r = f.call(http.MethodPost, agentPath+"/exec-policy/try", "member", map[string]any{"command": "rm x",
				"exec_policy": map[string]any{"default": "deny", "rules": []map[string]string{{"action": "allow", "program": "rm"}}}})
			wantStatus(t, "try a draft", r, http.StatusOK)
			if !strings.Contains(string(r.body), `"action":"allow"`) {
				t.Errorf("draft try = %s", r.body)
			}
			r = f.call(http.MethodPost, agentPath+"/exec-policy/try", "member", map[string]any{"command": "if then"})
			wantStatus(t, "try unparsable", r, http.StatusBadRequest)
			if e := r.envelope(t).Error; e.Code != "command_unparsable" {
				t.Errorf("unparsable try = %+v", e)
			}
			r = f.call(http.MethodPost, agentPath+"/exec-policy/try", "plain", map[string]any{"command": "ls"})
			wantStatus(t, "try by who may not see the agent", r, http.StatusNotFound)
		})

		t.Run("a legacy agent keeps denying what its patterns denied", func(t *testing.T) {
			ten, err := f.e.c.Tenants.Open(context.Background(), "acme")
			if err != nil {
				t.Fatal(err)
			}
			defer ten.Release()
			// As the row of an agent saved before migration 0021 reads.
			if err := ten.DB.Exec("UPDATE agents SET exec_policy = '', exec_policy_digest = '', command_policy = ? WHERE id = ?",
				`["^echo legacy", "(?i)shutdown"]`, f.agentID).Error; err != nil {
				t.Fatal(err)
			}
			if err := ten.DB.Exec("UPDATE config_version SET version = version + 1 WHERE id = 1").Error; err != nil {
				t.Fatal(err)
			}
			time.Sleep(1100 * time.Millisecond)
			before := f.agentd.requests.Load()
			for _, tc := range []struct {
				command string
				env     map[string]string
			}{{"echo legacy-x", nil}, {"sudo SHUTDOWN -h now", nil}, {`eval "$X"`, map[string]string{"X": "shutdown"}}} {
				r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": tc.command, "env": tc.env})
				wantStatus(t, "legacy "+tc.command, r, http.StatusForbidden)
			}
			if n := f.agentd.requests.Load(); n != before {
				t.Errorf("agentd got %v", f.agentd.callsSince(int(before)))
			}
			a := f.agent(t)
			if len(a.ExecPolicy.Rules) != 2 || a.ExecPolicy.Rules[0].Text != "^echo legacy" || a.ExecPolicy.Rules[0].Reason != "migrated command pattern" {
				t.Errorf("legacy agent reads as %+v", a.ExecPolicy)
			}
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo fine", "wait_ms": 5000})
			wantStatus(t, "what the patterns allowed still runs", r, http.StatusCreated)
		})
	})
}

// TestExecPolicyPage: the agent page edits the rules as a table (no JSON
// by hand), reorders them by number, removes a row, shows a rule's error
// on its row, and its "try a command" box says which rule decides.
func TestExecPolicyPage(t *testing.T) {
	t.Parallel()
	f := newTerminalFixture(t, store.SQLite)
	const csrf = "exec-policy-csrf-token-0123456789"
	page := func(method, path, who string, form url.Values) response {
		t.Helper()
		req := request{method: method, path: fmt.Sprintf("/o/acme/agents/%d", f.agentID) + path,
			cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens[who]}, {Name: "gh_csrf", Value: csrf}},
			header:  http.Header{"X-Csrf-Token": {csrf}}}
		if form != nil {
			req.body, req.contentType = strings.NewReader(form.Encode()), "application/x-www-form-urlencoded"
		}
		return f.e.do(req)
	}
	r := page(http.MethodGet, "", "entered-admin", nil)
	wantStatus(t, "agent page", r, http.StatusOK)
	for _, id := range []string{`data-testid="exec-rules"`, `data-testid="exec-summary"`, `data-testid="exec-try-form"`, `name="rule_program"`} {
		if !strings.Contains(string(r.body), id) {
			t.Fatalf("the agent page has no %s", id)
		}
	}
	form := func(rows [][6]string) url.Values {
		v := url.Values{"name": {"coder-build-host"}, "config": {`{"model":"m"}`}, "sandbox_mode": {"off"}, "department_id": {fmt.Sprint(f.dept1)},
			"idle_minutes": {"15"}, "reclaim_minutes": {"60"}, "exec_default": {"allow"}, "exec_dynamic": {"ask"}, "exec_timeout_seconds": {"90"}}
		v["environment_ids"] = []string{fmt.Sprint(f.envID(t))}
		for _, row := range rows {
			for i, k := range []string{"rule_order", "rule_action", "rule_program", "rule_args", "rule_text", "rule_reason"} {
				v.Add(k, row[i])
			}
			v.Add("rule_sha256", "")
		}
		return v
	}
	// Row order 3, 1, 2 (by number) and a row removed, a blank row ignored.
	r = page(http.MethodPost, "", "entered-admin", form([][6]string{
		{"3", "ask", "git", "push *", "", "pushing needs a person"},
		{"1", "deny", "rm", "", "", "no deleting"},
		{"2", "remove", "curl", "", "", ""},
		{"2", "deny", "", "", "^shutdown", ""},
		{"9", "deny", "", "", "", ""},
	}))
	if r.status != http.StatusSeeOther {
		t.Fatalf("save the rules: %d %.500s", r.status, r.body)
	}
	a := f.agent(t)
	if len(a.ExecPolicy.Rules) != 3 || a.ExecPolicy.Rules[0].Program != "rm" || a.ExecPolicy.Rules[1].Text != "^shutdown" ||
		a.ExecPolicy.Rules[2].Program != "git" || a.ExecPolicy.Rules[2].Args != "push *" || a.ExecPolicy.Rules[2].Action != "ask" ||
		a.ExecPolicy.ApprovalTimeout != 90 {
		t.Fatalf("saved rules = %+v", a.ExecPolicy.Rules)
	}
	r = page(http.MethodPost, "", "entered-admin", form([][6]string{{"1", "deny", "rm", "", "", ""}, {"2", "deny", "bin/rm", "", "", ""}}))
	wantStatus(t, "a bad rule", r, http.StatusBadRequest)
	if !strings.Contains(string(r.body), `data-testid="exec-rule-1-error"`) || !strings.Contains(string(r.body), "Rule 2: the program") {
		t.Errorf("the bad rule's error is not on its row: %.3000s", r.body)
	}
	r = page(http.MethodPost, "/exec-policy/try", "member", url.Values{"command": {"sudo rm -rf x"}})
	wantStatus(t, "try on the page as a reader", r, http.StatusOK)
	if body := string(r.body); !strings.Contains(body, `data-testid="exec-try-action">deny<`) || !strings.Contains(body, "rule 1: deny program rm") {
		t.Errorf("the try box does not show the deciding rule: %.3000s", body)
	}
	r = page(http.MethodPost, "/exec-policy/try", "member", url.Values{"command": {"echo 'x"}})
	wantStatus(t, "try an unparsable line on the page", r, http.StatusBadRequest)
	if !strings.Contains(string(r.body), `data-testid="exec-try-error"`) {
		t.Errorf("no parse error shown: %.2000s", r.body)
	}
}

// envID is the id of the fixture's host environment.
func (f *terminalFixture) envID(t *testing.T) int64 {
	t.Helper()
	r := f.call(http.MethodGet, fmt.Sprintf("/agents/%d", f.agentID), "entered-admin", nil)
	var a struct {
		EnvironmentIDs []int64 `json:"environment_ids"`
	}
	r.decode(t, &a)
	if len(a.EnvironmentIDs) != 1 {
		t.Fatalf("environment_ids = %v", a.EnvironmentIDs)
	}
	return a.EnvironmentIDs[0]
}
