package handlers_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

type pendingJSON struct {
	Approval struct {
		ID        int64     `json:"id"`
		State     string    `json:"state"`
		ExpiresAt time.Time `json:"expires_at"`
		Rule      string    `json:"rule"`
	} `json:"approval"`
}

// TestExecApproval: an agent key's exec of git push under an ask rule is
// held as a pending approval (202) that reaches no agentd; the
// department's owner approves it through the API; the requester's
// re-send with approval_id runs it once, through the audited exec path,
// as the requester, its output recorded and its approval carrying the
// command; a second decision and a second run are 409s; a deny releases a
// waiting exec with 403 approval_denied, an approval one with the
// command's run.
func TestExecApproval(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		r := f.call(http.MethodPatch, fmt.Sprintf("/agents/%d", f.agentID), "entered-admin", map[string]any{"exec_policy": corpusExecPolicy})
		wantStatus(t, "set the execution policy", r, http.StatusOK)
		r = f.call(http.MethodPost, f.sessionPath("/commands"), "member-key", map[string]any{"command": "ls", "wait_ms": 5000})
		wantStatus(t, "an allowed command runs", r, http.StatusCreated)
		waitFollowersIdle(t, f.e)

		const push = "git push origin main"
		decide := func(id int64, decision string) response {
			return f.call(http.MethodPost, fmt.Sprintf("/approvals/%d/decision", id), "owner",
				map[string]any{"decision": decision, "scope": "once", "reason": "reviewed"})
		}

		var approvalID int64
		t.Run("ask answers 202 pending, before agentd", func(t *testing.T) {
			before := f.agentd.requests.Load()
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member-key", map[string]any{"command": push})
			wantStatus(t, "ask", r, http.StatusAccepted)
			var p pendingJSON
			r.decode(t, &p)
			if p.Approval.ID == 0 || p.Approval.State != "pending" || !strings.Contains(p.Approval.Rule, "rule 3") || time.Until(p.Approval.ExpiresAt) < 5*time.Minute {
				t.Fatalf("pending = %s", r.body)
			}
			approvalID = p.Approval.ID
			if n := f.agentd.requests.Load(); n != before {
				t.Errorf("agentd got %v while the request is pending", f.agentd.callsSince(int(before)))
			}
			// Re-sent before a decision, it is still pending, and still
			// nothing reaches agentd.
			r = f.call(http.MethodPost, f.sessionPath("/commands"), "member-key", map[string]any{"command": push, "approval_id": approvalID})
			wantStatus(t, "re-sent while pending", r, http.StatusAccepted)
			if n := f.agentd.requests.Load(); n != before {
				t.Errorf("agentd got %v while the request is pending", f.agentd.callsSince(int(before)))
			}
		})
		if approvalID == 0 {
			t.FailNow()
		}

		t.Run("the owner approves once; a second decision is 409", func(t *testing.T) {
			r := decide(approvalID, "approve")
			wantStatus(t, "approve", r, http.StatusOK)
			r = decide(approvalID, "deny")
			wantStatus(t, "decide again", r, http.StatusConflict)
		})

		t.Run("another command line cannot use the approval", func(t *testing.T) {
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member-key", map[string]any{"command": push + " --force", "approval_id": approvalID})
			wantStatus(t, "mismatch", r, http.StatusConflict)
			if c := r.envelope(t).Error.Code; c != "approval_mismatch" {
				t.Errorf("code %s", c)
			}
		})

		t.Run("the re-send runs it once, as the requester, recorded", func(t *testing.T) {
			before := f.agentd.requests.Load()
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member-key", map[string]any{"command": push, "approval_id": approvalID, "wait_ms": 10000})
			wantStatus(t, "run the approved command", r, http.StatusCreated)
			var out outputJSON
			r.decode(t, &out)
			if out.CommandID == 0 || f.agentd.requests.Load() == before {
				t.Fatalf("approved run = %s", r.body)
			}
			r = f.call(http.MethodPost, f.sessionPath("/commands"), "member-key", map[string]any{"command": push, "approval_id": approvalID})
			wantStatus(t, "run it again", r, http.StatusConflict)
			if c := r.envelope(t).Error.Code; c != "approval_not_runnable" {
				t.Errorf("code %s", c)
			}
			r = f.call(http.MethodGet, fmt.Sprintf("/approvals/%d", approvalID), "owner", nil)
			wantStatus(t, "read the approval", r, http.StatusOK)
			var ap struct {
				State     string `json:"state"`
				CommandID *int64 `json:"command_id"`
			}
			r.decode(t, &ap)
			if ap.State != "approved" || ap.CommandID == nil || *ap.CommandID != out.CommandID {
				t.Errorf("approval after its run = %s, want command %d", r.body, out.CommandID)
			}
			waitFollowersIdle(t, f.e)
			r = f.call(http.MethodGet, f.sessionPath("/commands"), "owner", nil)
			wantStatus(t, "history", r, http.StatusOK)
			var hist struct {
				Items []struct {
					ID          int64  `json:"id"`
					Command     string `json:"command"`
					State       string `json:"state"`
					StartedBy   string `json:"started_by"`
					OutputBytes int64  `json:"output_bytes"`
				} `json:"items"`
			}
			r.decode(t, &hist)
			runs := 0
			for _, c := range hist.Items {
				if c.Command == push {
					runs++
					if c.ID != out.CommandID || c.State == "running" || c.OutputBytes == 0 || !strings.Contains(c.StartedBy, "member") {
						t.Errorf("the approved command's record = %+v", c)
					}
				}
			}
			if runs != 1 {
				t.Errorf("%d runs of %q, want 1", runs, push)
			}
			found := false
			for _, ev := range orgEvents(t, f.orgFixture, "action:command.exec") {
				var det struct {
					CommandID  int64 `json:"command_id"`
					ApprovalID int64 `json:"approval_id"`
					ApprovedBy struct {
						Type, ID, Name string
					} `json:"approved_by"`
				}
				if json.Unmarshal(ev.Details, &det) == nil && det.CommandID == out.CommandID {
					found = det.ApprovalID == approvalID && det.ApprovedBy.ID != "" && ev.Actor.Type == "api_key"
				}
			}
			if !found {
				t.Error("the approved command's command.exec does not carry its approval, its approver and the requester's key")
			}
		})

		// waitingExec sends push (with a marker, so each is its own request)
		// waiting up to 20 s; the answer arrives on the channel.
		waitingExec := func(marker string) <-chan response {
			done := make(chan response, 1)
			tok := f.keys["member-key"]
			go func() {
				done <- f.e.json(http.MethodPost, "/api/v1/orgs/acme"+f.sessionPath("/commands"), tok,
					map[string]any{"command": push + " " + marker, "wait_ms": 20000})
			}()
			return done
		}
		pendingFor := func(t *testing.T, command string) int64 {
			t.Helper()
			deadline := time.Now().Add(15 * time.Second)
			for time.Now().Before(deadline) {
				r := f.call(http.MethodGet, "/approvals?state=pending", "owner", nil)
				wantStatus(t, "pending list", r, http.StatusOK)
				var page struct {
					Items []struct {
						ID      int64  `json:"id"`
						Command string `json:"command"`
					} `json:"items"`
				}
				r.decode(t, &page)
				for _, it := range page.Items {
					if it.Command == command {
						return it.ID
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Fatalf("no pending request for %q", command)
			return 0
		}

		t.Run("a deny releases the waiting exec with approval_denied", func(t *testing.T) {
			before := f.agentd.requests.Load()
			done := waitingExec("deny-me")
			id := pendingFor(t, push+" deny-me")
			wantStatus(t, "deny", decide(id, "deny"), http.StatusOK)
			select {
			case r := <-done:
				wantStatus(t, "the waiting exec", r, http.StatusForbidden)
				if e := r.envelope(t).Error; e.Code != "approval_denied" || !strings.Contains(e.Message, "reviewed") {
					t.Errorf("denied exec answered %+v", e)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("the waiting exec was not released by the deny")
			}
			if n := f.agentd.requests.Load(); n != before {
				t.Errorf("agentd got %v for a denied command", f.agentd.callsSince(int(before)))
			}
		})

		t.Run("an approval on another goroutine runs the waiting exec", func(t *testing.T) {
			done := waitingExec("approve-me")
			id := pendingFor(t, push+" approve-me")
			wantStatus(t, "approve", decide(id, "approve"), http.StatusOK)
			select {
			case r := <-done:
				wantStatus(t, "the waiting exec", r, http.StatusCreated)
				var out outputJSON
				r.decode(t, &out)
				if out.CommandID == 0 {
					t.Errorf("released exec = %s", r.body)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("the waiting exec was not released by the approval")
			}
			waitFollowersIdle(t, f.e)
		})

		t.Run("of execs racing to run one approval, one runs it", func(t *testing.T) {
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member-key", map[string]any{"command": push + " race"})
			wantStatus(t, "ask", r, http.StatusAccepted)
			var p pendingJSON
			r.decode(t, &p)
			wantStatus(t, "approve", decide(p.Approval.ID, "approve"), http.StatusOK)
			tok := f.keys["member-key"]
			answers := make(chan int, 4)
			for range 4 {
				go func() {
					answers <- f.e.json(http.MethodPost, "/api/v1/orgs/acme"+f.sessionPath("/commands"), tok,
						map[string]any{"command": push + " race", "approval_id": p.Approval.ID}).status
				}()
			}
			got := map[int]int{}
			for range 4 {
				got[<-answers]++
			}
			if got[http.StatusCreated] != 1 || got[http.StatusConflict] != 3 {
				t.Errorf("racing runs answered %v, want one 201 and three 409", got)
			}
			waitFollowersIdle(t, f.e)
		})

		t.Run("scope rule adds an allow rule, audited as agent.update", func(t *testing.T) {
			// Asked by rule 3: an allow rule cannot lift it.
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member-key", map[string]any{"command": push + " by-rule"})
			wantStatus(t, "ask by rule", r, http.StatusAccepted)
			var p pendingJSON
			r.decode(t, &p)
			r = f.call(http.MethodPost, fmt.Sprintf("/approvals/%d/decision", p.Approval.ID), "owner", map[string]any{"decision": "approve", "scope": "rule"})
			wantStatus(t, "rule scope of a rule's ask", r, http.StatusBadRequest)
			if !strings.Contains(string(r.body), "strictest") {
				t.Errorf("rule scope of a rule's ask: %s", r.body)
			}
			// Asked by the default: the rule lets it run without asking.
			r = f.call(http.MethodPatch, fmt.Sprintf("/agents/%d", f.agentID), "entered-admin", map[string]any{"exec_policy": map[string]any{"default": "ask"}})
			wantStatus(t, "default ask", r, http.StatusOK)
			r = f.call(http.MethodPost, f.sessionPath("/commands"), "member-key", map[string]any{"command": "git status --short"})
			wantStatus(t, "ask by default", r, http.StatusAccepted)
			r.decode(t, &p)
			r = f.call(http.MethodPost, fmt.Sprintf("/approvals/%d/decision", p.Approval.ID), "owner", map[string]any{"decision": "approve", "scope": "rule", "reason": "fine"})
			wantStatus(t, "rule scope", r, http.StatusOK)
			a := f.agent(t)
			if n := len(a.ExecPolicy.Rules); n != 1 || a.ExecPolicy.Rules[0].Action != "allow" || a.ExecPolicy.Rules[0].Program != "git" || a.ExecPolicy.Rules[0].Args != "status --short" {
				t.Fatalf("rules after a rule-scope approval: %+v", a.ExecPolicy.Rules)
			}
			audited := false
			for _, ev := range orgEvents(t, f.orgFixture, "action:agent.update") {
				audited = audited || strings.Contains(string(ev.Details), fmt.Sprintf(`"approval_id":%d`, p.Approval.ID))
			}
			if !audited {
				t.Error("the rule is not audited as agent.update naming the approval")
			}
			r = f.call(http.MethodPost, f.sessionPath("/commands"), "member-key", map[string]any{"command": "git status --short", "wait_ms": 5000})
			wantStatus(t, "the same command now runs without asking", r, http.StatusCreated)
			waitFollowersIdle(t, f.e)
		})
		t.Run("who created the requesting key may not decide", func(t *testing.T) {
			// The org admin mints a service key, which asks (the default is
			// ask by now): approving it would be deciding their own.
			r := f.call(http.MethodPost, "/api-keys", "admin", map[string]any{"name": "admin's runtime", "service": true,
				"roles": []map[string]string{{"role": "member", "domain": fmt.Sprintf("dept:%d", f.dept1)}}})
			wantStatus(t, "the admin mints a service key", r, http.StatusCreated)
			var key struct{ Secret string }
			r.decode(t, &key)
			r = f.e.json(http.MethodPost, "/api/v1/orgs/acme/sessions", key.Secret, map[string]any{"agent_id": f.agentID})
			wantStatus(t, "the service key opens a session", r, http.StatusCreated)
			var sess struct{ ID int64 }
			r.decode(t, &sess)
			r = f.e.json(http.MethodPost, fmt.Sprintf("/api/v1/orgs/acme/sessions/%d/commands", sess.ID), key.Secret, map[string]any{"command": "git log -1"})
			wantStatus(t, "the service key asks", r, http.StatusAccepted)
			var p pendingJSON
			r.decode(t, &p)
			r = f.call(http.MethodPost, fmt.Sprintf("/approvals/%d/decision", p.Approval.ID), "admin", map[string]any{"decision": "approve", "scope": "once"})
			wantStatus(t, "the key's creator decides", r, http.StatusForbidden)
			r = f.call(http.MethodPost, fmt.Sprintf("/approvals/%d/decision", p.Approval.ID), "owner", map[string]any{"decision": "deny", "scope": "once", "reason": "not now"})
			wantStatus(t, "the department owner decides", r, http.StatusOK)
		})
	})
}
