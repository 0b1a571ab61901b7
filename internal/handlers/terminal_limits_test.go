package handlers_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// burst sends n copies of one JSON request as who at once and returns the
// responses.
func (f *terminalFixture) burst(method, path, who string, n int, v any) []response {
	tok := f.tokens[who]
	if k, ok := f.keys[who]; ok {
		tok = k
	}
	out := make([]response, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = f.e.json(method, "/api/v1/orgs/acme"+path, tok, v)
		}()
	}
	wg.Wait()
	return out
}

// tally counts responses by status and collects the error messages of
// those with status refused, failing on any other answer but ok.
func tally(t *testing.T, f *terminalFixture, rs []response, ok, refused int, code string) (nOK int, messages map[string]int) {
	t.Helper()
	messages = map[string]int{}
	for _, r := range rs {
		switch r.status {
		case ok:
			nOK++
		case refused:
			e := r.envelope(t)
			if e.Error.Code != code {
				t.Fatalf("refused with code %q, want %q: %s", e.Error.Code, code, r.body)
			}
			messages[e.Error.Message]++
		default:
			t.Fatalf("status %d, want %d or %d: %s\nconsole errors:\n%s", r.status, ok, refused, r.body, consoleErrors(f))
		}
	}
	return nOK, messages
}

// consoleErrors is what the console logged at level ERROR.
func consoleErrors(f *terminalFixture) string {
	var out []string
	for _, line := range strings.Split(f.e.logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// auditEvents exports the org's audit events matching q.
func (f *terminalFixture) auditEvents(t *testing.T, q string) []auditEventJSON {
	t.Helper()
	r := f.call(http.MethodGet, "/audit/export?format=jsonl&q="+strings.ReplaceAll(q, " ", "+"), "admin", nil)
	wantStatus(t, "audit export", r, http.StatusOK)
	var out []auditEventJSON
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if bytes.HasPrefix(sc.Bytes(), []byte(`{"#export"`)) {
			continue // a filtered export's header
		}
		var e auditEventJSON
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit line %s: %v", sc.Bytes(), err)
		}
		out = append(out, e)
	}
	return out
}

type auditEventJSON struct {
	Action string `json:"action"`
	Target struct {
		Type string `json:"type"`
		ID   string `json:"id"`
	} `json:"target"`
	Decision string         `json:"decision"`
	Details  map[string]any `json:"details"`
}

// TestSessionCaps: a burst of parallel creates stops exactly at the cap of
// open sessions per user, then at the agent's cap for everybody; each
// refusal is a 429 naming the cap, writes no session and is audited as a
// denial; a closed session frees its place. Issue 21, item 10.
func TestSessionCaps(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d, func(c *config.Config) { c.MaxOpenSessionsPerUser, c.MaxOpenSessionsPerAgent = 5, 8 })
		openOf := func(t *testing.T, who string) []int64 {
			t.Helper()
			r := f.call(http.MethodGet, fmt.Sprintf("/sessions?user_id=%d&limit=200", f.ids[who]), "admin", nil)
			wantStatus(t, "list sessions", r, http.StatusOK)
			var p struct{ Items []sessionOut }
			r.decode(t, &p)
			var ids []int64
			for _, s := range p.Items {
				if s.State == "closed" || s.State == "lost" {
					t.Fatalf("%s has a %s session, and none was closed: %+v", who, s.State, s)
				}
				ids = append(ids, s.ID)
			}
			return ids
		}

		t.Run("a burst of creates stops at the user's cap", func(t *testing.T) {
			// The fixture's member holds one session already.
			rs := f.burst(http.MethodPost, "/sessions", "member", 50, map[string]any{"agent_id": f.agentID})
			n, msgs := tally(t, f, rs, http.StatusCreated, http.StatusTooManyRequests, "session_limit")
			want := "You have 5 open sessions, the most allowed per user; close one first."
			if n != 4 || msgs[want] != 46 || len(msgs) != 1 {
				t.Fatalf("%d created, refusals %v; want 4 created and 46 refusals saying %q", n, msgs, want)
			}
			if got := openOf(t, "member"); len(got) != 5 {
				t.Fatalf("member has %d sessions, want exactly the cap of 5", len(got))
			}
		})

		t.Run("the agent's cap holds for everybody", func(t *testing.T) {
			rs := f.burst(http.MethodPost, "/sessions", "owner", 20, map[string]any{"agent_id": f.agentID})
			n, msgs := tally(t, f, rs, http.StatusCreated, http.StatusTooManyRequests, "session_limit")
			want := `Agent "coder-build-host" has 8 open sessions, the most allowed per agent; one of them must be closed before another starts.`
			if n != 3 || msgs[want] != 17 || len(msgs) != 1 {
				t.Fatalf("%d created, refusals %v; want 3 created and 17 refusals saying %q", n, msgs, want)
			}
			if got := openOf(t, "owner"); len(got) != 3 {
				t.Fatalf("owner has %d sessions, want 3", len(got))
			}
		})

		t.Run("each refusal is audited as a denial", func(t *testing.T) {
			n := 0
			for _, e := range f.auditEvents(t, "action:authz.deny") {
				if e.Details["answered"] == "too_many_requests" && e.Details["action"] == "create" && e.Details["object"] == "sessions" {
					if rule, _ := e.Details["rule"].(string); !strings.Contains(rule, "open sessions per") {
						t.Fatalf("denial rule %q names no cap", rule)
					}
					n++
				}
			}
			if n != 46+17 {
				t.Fatalf("%d cap refusals audited, want 63", n)
			}
		})

		t.Run("a closed session frees its place", func(t *testing.T) {
			ids := openOf(t, "member")
			wantStatus(t, "close", f.call(http.MethodDelete, fmt.Sprintf("/sessions/%d", ids[0]), "member", nil), http.StatusOK)
			wantStatus(t, "create again", f.call(http.MethodPost, "/sessions", "member", map[string]any{"agent_id": f.agentID}), http.StatusCreated)
			r := f.call(http.MethodPost, "/sessions", "member", map[string]any{"agent_id": f.agentID})
			wantStatus(t, "one more", r, http.StatusTooManyRequests)
		})
	})
}

// TestCommandCaps: the running commands of one user's sessions and of one
// agent's are capped; a burst of execs stops exactly at the cap, one more
// is a 429 naming the cap that writes no command and reaches no agentd,
// and an ended command frees its place. Issue 21, item 10.
func TestCommandCaps(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d, func(c *config.Config) { c.MaxRunningCommandsPerUser, c.MaxRunningCommandsPerAgent = 3, 4 })
		sleep := map[string]any{"command": "sleep 30"}
		var running []int64
		history := func(t *testing.T, sessionID int64) []commandHistory {
			t.Helper()
			r := f.call(http.MethodGet, fmt.Sprintf("/sessions/%d/commands?limit=200", sessionID), "admin", nil)
			wantStatus(t, "history", r, http.StatusOK)
			var h struct{ Items []commandHistory }
			r.decode(t, &h)
			return h.Items
		}
		creates := func(since int) int {
			n := 0
			for _, c := range f.agentd.callsSince(since) {
				if c == "POST /v1/sessions" {
					n++
				}
			}
			return n
		}

		t.Run("a burst of execs stops at the user's cap", func(t *testing.T) {
			rs := f.burst(http.MethodPost, f.sessionPath("/commands"), "member", 10, sleep)
			n, msgs := tally(t, f, rs, http.StatusCreated, http.StatusTooManyRequests, "command_limit")
			if n != 3 || len(msgs) != 1 {
				t.Fatalf("%d started, refusals %v; want 3 started, the rest refused", n, msgs)
			}
			for _, r := range rs {
				if r.status == http.StatusCreated {
					var o outputJSON
					r.decode(t, &o)
					running = append(running, o.CommandID)
				}
			}
			if h := history(t, f.session); len(h) != 3 {
				t.Fatalf("%d commands recorded, want 3", len(h))
			}
		})

		t.Run("one more is refused and reaches no agentd", func(t *testing.T) {
			before := len(f.agentd.callsSince(0))
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", sleep)
			wantStatus(t, "one more", r, http.StatusTooManyRequests)
			e := r.envelope(t)
			want := "You have 3 running commands, the most allowed per user; wait for one to end, or kill one, first."
			if e.Error.Code != "command_limit" || e.Error.Message != want {
				t.Fatalf("refusal %+v, want command_limit saying %q", e.Error, want)
			}
			if n := creates(before); n != 0 {
				t.Fatalf("%d creates reached agentd after the refusal", n)
			}
			if h := history(t, f.session); len(h) != 3 {
				t.Fatalf("%d commands recorded, want 3: the refusal wrote one", len(h))
			}
		})

		t.Run("the agent's cap counts every user's commands", func(t *testing.T) {
			r := f.call(http.MethodPost, "/sessions", "owner", map[string]any{"agent_id": f.agentID})
			wantStatus(t, "owner's session", r, http.StatusCreated)
			var s sessionOut
			r.decode(t, &s)
			r = f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/commands", s.ID), "owner", sleep)
			wantStatus(t, "the agent's fourth", r, http.StatusCreated)
			before := len(f.agentd.callsSince(0))
			r = f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/commands", s.ID), "owner", sleep)
			wantStatus(t, "the agent's fifth", r, http.StatusTooManyRequests)
			want := `Agent "coder-build-host" has 4 running commands, the most allowed per agent; one of them must end before another starts.`
			if e := r.envelope(t); e.Error.Code != "command_limit" || e.Error.Message != want {
				t.Fatalf("refusal %+v, want command_limit saying %q", e.Error, want)
			}
			if n := creates(before); n != 0 {
				t.Fatalf("%d creates reached agentd after the refusal", n)
			}
		})

		t.Run("an ended command frees its place", func(t *testing.T) {
			wantStatus(t, "kill", f.call(http.MethodDelete, f.sessionPath("/commands/%d", running[0]), "member", nil), http.StatusOK)
			waitCommandEnded(t, f, running[0])
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo freed", "wait_ms": 5000})
			wantStatus(t, "exec after a kill", r, http.StatusCreated)
			for _, id := range running[1:] {
				wantStatus(t, "kill", f.call(http.MethodDelete, f.sessionPath("/commands/%d", id), "member", nil), http.StatusOK)
			}
		})
	})
}

// TestResizeCoalescing: 300 resizes of one command in quick succession
// make at most one command.resize audit event a second, every size that
// reached agentd was recorded first, and agentd ends with the last size
// asked for. Issue 21, item 11.
func TestResizeCoalescing(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "while read x; do stty size; done",
			"tty": true, "rows": 24, "cols": 80})
		wantStatus(t, "exec", r, http.StatusCreated)
		var o outputJSON
		r.decode(t, &o)
		calls := len(f.agentd.callsSince(0))
		started := time.Now()
		var rows, cols int
		for i := range 300 {
			rows, cols = 20+i%40, 60+i
			wantStatus(t, "resize", f.call(http.MethodPost, f.sessionPath("/commands/%d/resize", o.CommandID), "member",
				map[string]any{"rows": rows, "cols": cols}), http.StatusNoContent)
		}
		elapsed := time.Since(started)
		last := fmt.Sprintf("%d %d", rows, cols)

		// The held last size is recorded when its second is over.
		var events []auditEventJSON
		for deadline := time.Now().Add(5 * time.Second); ; {
			events = events[:0]
			for _, e := range f.auditEvents(t, "action:command.resize") {
				if e.Target.ID == strconv.FormatInt(o.CommandID, 10) {
					events = append(events, e)
				}
			}
			if n := len(events); n > 0 && fmt.Sprintf("%v %v", events[n-1].Details["rows"], events[n-1].Details["cols"]) == last {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the last size %s was never recorded; events %+v", last, events)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if most := int(elapsed/time.Second) + 2; len(events) > most {
			t.Fatalf("%d command.resize events for 300 resizes in %s, want at most %d", len(events), elapsed.Round(time.Millisecond), most)
		}
		if c, _ := events[len(events)-1].Details["coalesced"].(float64); c < 1 {
			t.Fatalf("the last event %+v does not say how many resizes it stands for", events[len(events)-1])
		}

		// agentd ends with the last size.
		seen, cursor := "", uint64(0)
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(seen, last); {
			if time.Now().After(deadline) {
				t.Fatalf("stty never reported %s: %q", last, seen)
			}
			wantStatus(t, "stdin", f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", o.CommandID), "member", map[string]any{"text": "\n"}),
				http.StatusNoContent)
			r := f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=500", o.CommandID, cursor), "member", nil)
			var p outputJSON
			r.decode(t, &p)
			for _, ch := range p.Chunks {
				seen += string(ch.Data)
				cursor = ch.ID
			}
		}
		// Every size that reached agentd was recorded before it.
		resizes := 0
		for _, c := range f.agentd.callsSince(calls) {
			if strings.HasSuffix(c, "/resize") {
				resizes++
			}
		}
		if resizes != len(events) {
			t.Fatalf("agentd received %d resizes, and %d were recorded", resizes, len(events))
		}
		wantStatus(t, "kill", f.call(http.MethodDelete, f.sessionPath("/commands/%d", o.CommandID), "member", nil), http.StatusOK)
		waitCommandEnded(t, f, o.CommandID)
	})
}

// TestServiceKeyRunsInItsSession: a service key with the member role may
// create a session and then run every terminal operation in it, as a user
// may in theirs; another key of the same role may not see it. Issue 21,
// item 12.
func TestServiceKeyRunsInItsSession(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		for _, name := range []string{"runner", "other-runner"} {
			r := f.e.json(http.MethodPost, "/api/v1/orgs/acme/api-keys", f.tokens["entered-admin"], map[string]any{"name": name, "service": true,
				"roles": []map[string]string{{"role": "member", "domain": fmt.Sprintf("dept:%d", f.dept1)}}})
			wantStatus(t, "service key "+name, r, http.StatusCreated)
			var k struct{ Secret string }
			r.decode(t, &k)
			f.keys[name] = k.Secret
		}
		r := f.call(http.MethodPost, "/sessions", "runner", map[string]any{"agent_id": f.agentID})
		wantStatus(t, "the key creates a session", r, http.StatusCreated)
		var s sessionOut
		r.decode(t, &s)
		path := func(format string, args ...any) string {
			return fmt.Sprintf("/sessions/%d", s.ID) + fmt.Sprintf(format, args...)
		}

		r = f.call(http.MethodPost, path("/commands"), "runner", map[string]any{"command": "echo ok", "wait_ms": 5000})
		wantStatus(t, "the key runs a command in it", r, http.StatusCreated)
		var o outputJSON
		r.decode(t, &o)
		out := ""
		for _, ch := range o.Chunks {
			out += string(ch.Data)
		}
		if o.State != "exited" || out != "ok\n" {
			t.Fatalf("exec answered %s with %q, want exited with \"ok\\n\"", o.State, out)
		}
		wantStatus(t, "the key reads its history", f.call(http.MethodGet, path("/commands"), "runner", nil), http.StatusOK)
		wantStatus(t, "the key reads the output", f.call(http.MethodGet, path("/commands/%d/output", o.CommandID), "runner", nil), http.StatusOK)
		wantStatus(t, "the key stats its files", f.call(http.MethodPost, path("/files/stat"), "runner", map[string]any{"paths": []string{"."}}),
			http.StatusOK)

		r = f.call(http.MethodPost, path("/commands"), "other-runner", map[string]any{"command": "echo ok"})
		wantStatus(t, "another key of the same role", r, http.StatusNotFound)
	})
}
