package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/store"
)

// recOrg is an org with a host environment on a real agentd, an agent, a
// member with a session on it and an auditor.
type recOrg struct {
	srv                    *server
	slug                   string
	root, member, auditor  string // API tokens
	auditorEmail, password string
	session                int64
}

const recPassword = "a long and private passphrase"

// newRecOrg creates org slug on srv, set up to run commands.
func newRecOrg(t *testing.T, srv *server, platformToken, slug, agentdURL, agentdToken string) *recOrg {
	t.Helper()
	api := "/api/v1/orgs/" + slug
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs", platformToken, map[string]string{"slug": slug, "name": slug + " Corp"}, http.StatusCreated, nil)
	var entered struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, api+"/enter", platformToken, nil, http.StatusOK, &entered)
	o := &recOrg{srv: srv, slug: slug, root: entered.Token, auditorEmail: "ada@" + slug + ".test", password: recPassword}
	var dept, env, agent struct{ ID int64 }
	callAPI(t, srv.url, http.MethodPost, api+"/departments", o.root, map[string]string{"name": "Research"}, http.StatusCreated, &dept)
	callAPI(t, srv.url, http.MethodPost, api+"/environments", o.root, map[string]any{"name": "build-host", "kind": "host",
		"department_id": dept.ID, "url": agentdURL, "os": "linux", "deployment": "bare-metal", "agentd_token": agentdToken}, http.StatusCreated, &env)
	callAPI(t, srv.url, http.MethodPost, api+"/agents", o.root, map[string]any{"name": "coder", "department_id": dept.ID,
		"config": map[string]string{"model": "m"}, "environment_ids": []int64{env.ID}}, http.StatusCreated, &agent)
	person := func(email, role, domain string) string {
		var u struct {
			User            struct{ ID int64 }
			OneTimePassword string `json:"one_time_password"`
		}
		callAPI(t, srv.url, http.MethodPost, api+"/users", o.root, map[string]string{"email": email, "name": email}, http.StatusCreated, &u)
		callAPI(t, srv.url, http.MethodPost, api+"/roles", o.root, map[string]string{"subject": "user:" + strconv.FormatInt(u.User.ID, 10),
			"role": role, "domain": domain}, http.StatusNoContent, nil)
		var otp, tok struct{ Token string }
		callAPI(t, srv.url, http.MethodPost, api+"/auth/login", "", map[string]string{"email": email, "password": u.OneTimePassword}, http.StatusOK, &otp)
		callAPI(t, srv.url, http.MethodPost, api+"/auth/password", otp.Token,
			map[string]string{"current_password": u.OneTimePassword, "new_password": recPassword}, http.StatusNoContent, nil)
		callAPI(t, srv.url, http.MethodPost, api+"/auth/login", "", map[string]string{"email": email, "password": recPassword}, http.StatusOK, &tok)
		return tok.Token
	}
	o.member = person("mia@"+slug+".test", "member", "dept:"+strconv.FormatInt(dept.ID, 10))
	o.auditor = person(o.auditorEmail, "auditor", "org")
	var sess struct{ ID int64 }
	callAPI(t, srv.url, http.MethodPost, api+"/sessions", o.member, map[string]any{"agent_id": agent.ID}, http.StatusCreated, &sess)
	o.session = sess.ID
	return o
}

// run runs command in a TTY through the JSON API as the member and waits
// until its end is recorded.
func (o *recOrg) run(t *testing.T, command string) int64 {
	t.Helper()
	base := fmt.Sprintf("/api/v1/orgs/%s/sessions/%d/commands", o.slug, o.session)
	var out struct {
		CommandID int64 `json:"command_id"`
	}
	callAPI(t, o.srv.url, http.MethodPost, base, o.member, map[string]any{"command": command, "tty": true, "rows": 24, "cols": 80, "wait_ms": 0},
		http.StatusCreated, &out)
	waitCommandEnd(t, o.srv.url, base, o.member, out.CommandID)
	return out.CommandID
}

func (o *recOrg) recordingPath(cid int64) string {
	return fmt.Sprintf("/api/v1/orgs/%s/sessions/%d/commands/%d/recording", o.slug, o.session, cid)
}

// recordedOutput is the command's stored output chunks, concatenated.
func (o *recOrg) recordedOutput(t *testing.T, token string, cid int64) string {
	t.Helper()
	var rec struct {
		Events []struct {
			Stream string
			Data   []byte
		}
	}
	callAPI(t, o.srv.url, http.MethodGet, o.recordingPath(cid)+"?format=json", token, nil, http.StatusOK, &rec)
	var b strings.Builder
	for _, e := range rec.Events {
		if e.Stream != "gap" && e.Stream != "exec" { // exec records are not output
			b.Write(e.Data)
		}
	}
	return b.String()
}

type recHit struct {
	ID        int64   `json:"id"`
	At        float64 `json:"at"`
	Snippet   string  `json:"snippet"`
	ReplayURL string  `json:"replay_url"`
}

func (o *recOrg) search(t *testing.T, token, q string) []recHit {
	t.Helper()
	var res struct{ Items []recHit }
	callAPI(t, o.srv.url, http.MethodGet, "/api/v1/orgs/"+o.slug+"/recordings?q="+url.QueryEscape(q), token, nil, http.StatusOK, &res)
	return res.Items
}

// parseCast checks that b is asciicast v2 (a header line, then [time,
// code, data] events in time order) and returns its output events
// concatenated.
func parseCast(t *testing.T, b []byte) string {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	if !sc.Scan() {
		t.Fatal("the cast is empty")
	}
	var hdr struct {
		Version       *int
		Width, Height int
		Timestamp     int64
	}
	if err := json.Unmarshal(sc.Bytes(), &hdr); err != nil || hdr.Version == nil || *hdr.Version != 2 || hdr.Width < 1 || hdr.Height < 1 || hdr.Timestamp == 0 {
		t.Fatalf("cast header %q (%v)", sc.Text(), err)
	}
	var out strings.Builder
	last := 0.0
	for sc.Scan() {
		var ev []json.RawMessage
		var at float64
		var code, data string
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || len(ev) != 3 || json.Unmarshal(ev[0], &at) != nil ||
			json.Unmarshal(ev[1], &code) != nil || json.Unmarshal(ev[2], &data) != nil {
			t.Fatalf("cast event %q is not [time, code, data]", sc.Text())
		}
		if at < last {
			t.Fatalf("cast event at %v after one at %v", at, last)
		}
		last = at
		if code == "o" {
			out.WriteString(data)
		}
	}
	return out.String()
}

// TestRecordingReplayAndSearch: a command's recording downloads as
// asciicast v2 whose output equals the recording and as text; a word that
// only appeared in its output finds it, in its org only; reads and searches
// are audited. On SQLite and Postgres.
func TestRecordingReplayAndSearch(t *testing.T) {
	t.Parallel()
	for _, d := range []store.Dialect{store.SQLite, store.Postgres} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, d)
			agentdURL, agentdToken := agentdtest.Start(t, agentdtest.WithRoot(t.TempDir()))
			var login struct{ Token string }
			callAPI(t, srv.url, http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
			acme := newRecOrg(t, srv, login.Token, "acme", agentdURL, agentdToken)
			globex := newRecOrg(t, srv, login.Token, "globex", agentdURL, agentdToken)
			// "marmot" appears only in the output: the shell joins the quotes.
			cid := acme.run(t, `printf '\033[1;32mstarting\033[0m\n'; sleep 0.3; echo "mar""mot-$((40+2))"; echo done`)
			globex.run(t, "echo nothing to see")

			t.Run("the cast is asciicast v2 and its output equals the recording", func(t *testing.T) {
				cast := callAPI(t, srv.url, http.MethodGet, acme.recordingPath(cid)+"?format=cast", acme.member, nil, http.StatusOK, nil)
				rec := acme.recordedOutput(t, acme.member, cid)
				if !strings.Contains(rec, "marmot-42") {
					t.Fatalf("the recording lacks the output: %q", rec)
				}
				if got := parseCast(t, cast); got != rec {
					t.Fatalf("cast output %q, recording %q", got, rec)
				}
				txt := string(callAPI(t, srv.url, http.MethodGet, acme.recordingPath(cid)+"?format=txt", acme.auditor, nil, http.StatusOK, nil))
				if txt != "starting\nmarmot-42\ndone\n" {
					t.Fatalf("text %q", txt)
				}
			})
			t.Run("search finds the command by a word of its output, in its org only", func(t *testing.T) {
				hits := acme.search(t, acme.auditor, "marmot")
				if len(hits) != 1 || hits[0].ID != cid || hits[0].Snippet != "marmot-42" || hits[0].At < 0.25 ||
					!strings.HasPrefix(hits[0].ReplayURL, fmt.Sprintf("/o/acme/sessions/%d/commands/%d/replay?t=", acme.session, cid)) {
					t.Fatalf("hits %+v", hits)
				}
				if hits := acme.search(t, acme.auditor, "marmot exit:1"); len(hits) != 0 {
					t.Fatalf("exit:1 found %+v", hits)
				}
				if hits := globex.search(t, globex.auditor, "marmot"); len(hits) != 0 {
					t.Fatalf("the other org's search found %+v", hits)
				}
				if hits := globex.search(t, globex.root, "marmot"); len(hits) != 0 {
					t.Fatalf("the other org's admin found %+v", hits)
				}
				// acme's auditor is nobody in globex.
				callAPI(t, srv.url, http.MethodGet, "/api/v1/orgs/globex/recordings?q=marmot", acme.auditor, nil, http.StatusUnauthorized, nil)
				// A member may read their own session's recording but not search the org.
				callAPI(t, srv.url, http.MethodGet, "/api/v1/orgs/acme/recordings?q=marmot", acme.member, nil, http.StatusForbidden, nil)
			})
			t.Run("reads and searches are audited, once per request", func(t *testing.T) {
				var page struct {
					Items []struct {
						Action  string
						Target  struct{ ID string }
						Details json.RawMessage
					}
				}
				callAPI(t, srv.url, http.MethodGet, "/api/v1/orgs/acme/audit?q="+url.QueryEscape("action:recording."), acme.root, nil, http.StatusOK, &page)
				count := map[string]int{}
				for _, e := range page.Items {
					count[e.Action]++
					if e.Action == "recording.read" && e.Target.ID != strconv.FormatInt(cid, 10) {
						t.Fatalf("read event names command %s", e.Target.ID)
					}
				}
				// cast and json by the member, txt by the auditor; two
				// searches by acme's auditor (the member's refused search is
				// a denial, globex's searches are in globex's log).
				if count["recording.read"] != 3 || count["recording.search"] != 2 {
					t.Fatalf("audited %v", count)
				}
			})
		})
	}
}

// TestReplayInBrowser: an auditor finds a command on the recordings page by
// a word of its output, follows the hit to the replay and sees the text of
// the recording; the session page (which says what happens to the session
// next) and the audit log link to the same replay.
func TestReplayInBrowser(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	agentdURL, agentdToken := agentdtest.Start(t, agentdtest.WithRoot(t.TempDir()))
	var login struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
	acme := newRecOrg(t, srv, login.Token, "acme", agentdURL, agentdToken)
	cid := acme.run(t, `for i in 1 2 3; do echo "line $i of the ca""pybara"; sleep 0.2; done; printf '\033[31mred\033[0m end\n'`)
	txt := string(callAPI(t, srv.url, http.MethodGet, acme.recordingPath(cid)+"?format=txt", acme.member, nil, http.StatusOK, nil))
	// The player is compared with this text: it must hold what the
	// command wrote, or an empty player would match an empty recording.
	wantTxt := []string{"line 1 of the capybara", "line 2 of the capybara", "line 3 of the capybara", "red end"}
	if got := nonEmptyLines(txt); strings.Join(got, "\n") != strings.Join(wantTxt, "\n") {
		t.Fatalf("the recording as text is %q; want the lines %q", txt, wantTxt)
	}

	ctx := newBrowser(t)
	do(t, ctx, "sign in as the auditor", chromedp.Navigate(srv.url+"/o/acme/login"), signIn(acme.auditorEmail, acme.password), chromedp.WaitVisible(testid("my-roles")))
	do(t, ctx, "search the recordings",
		chromedp.Navigate(srv.url+"/o/acme/recordings"),
		chromedp.WaitVisible(css("#q")),
		chromedp.SendKeys(css("#q"), "capybara"),
		submits(chromedp.Click(testid("recordings-search"))),
		chromedp.WaitVisible(testid("recording-hit-"+strconv.FormatInt(cid, 10))),
	)
	if s := text(t, ctx, testid("hit-snippet")); s != "line 1 of the capybara" {
		t.Fatalf("snippet %q", s)
	}
	// The Replay column's heading is for screen readers only.
	if w := evalJS[float64](t, ctx, "hidden heading", `document.querySelector("th .visually-hidden").getBoundingClientRect().width`); w > 1 {
		t.Errorf("the screen-reader heading takes %.0f px on screen", w)
	}
	do(t, ctx, "follow the hit", submits(chromedp.Click(testid("hit-replay"))), chromedp.WaitVisible(testid("replay")))
	waitReplayScreen(t, ctx, txt)
	do(t, ctx, "play at twice the speed", chromedp.Click(testid("replay-speed-2")))
	if sp := get(t, ctx, "player speed", chromedp.Evaluate[float64]("window.gatehouseReplay.speed")); sp != 2 {
		t.Fatalf("speed %v after choosing 2×", sp)
	}
	waitReplayScreen(t, ctx, txt)

	do(t, ctx, "replay from the session page", chromedp.Navigate(fmt.Sprintf("%s/o/acme/sessions/%d", srv.url, acme.session)),
		chromedp.WaitVisible(testid("session-lifecycle")))
	if got := text(t, ctx, testid("session-lifecycle")); !strings.Contains(got, "nothing pauses or reclaims it") {
		t.Fatalf("a host session's lifecycle reads %q", got)
	}
	do(t, ctx, "follow Replay", submits(chromedp.Click(testid("command-replay"))), chromedp.WaitVisible(testid("replay")))
	waitReplayScreen(t, ctx, txt)

	do(t, ctx, "open the audit log", chromedp.Navigate(srv.url+"/o/acme/audit?q="+url.QueryEscape("action:command.end")),
		chromedp.WaitVisible(testid("audit-replay")), submits(chromedp.Click(testid("audit-replay"))), chromedp.WaitVisible(testid("replay")))
	waitReplayScreen(t, ctx, txt)
	if got := text(t, ctx, testid("replay-command")); !strings.Contains(got, "capybara") && !strings.Contains(got, "ca\"\"pybara") {
		t.Fatalf("replay page names command %q", got)
	}
}

// waitReplayScreen moves the player to the end of the recording and waits
// until its screen shows the lines of want (the recording as text).
func waitReplayScreen(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	wantLines := nonEmptyLines(want)
	if len(wantLines) == 0 {
		t.Fatalf("nothing to wait for: the expected screen %q has no lines", want)
	}
	deadline := time.Now().Add(30 * time.Second)
	var got []string
	for {
		screen := get(t, ctx, "read the player", chromedp.Evaluate[string](`(() => {
			const r = window.gatehouseReplay; const el = document.querySelector(".ap-term-text");
			if (!r || !r.player || !el) { return ""; }
			r.seekEnd().catch(() => {});
			return Array.from(el.querySelectorAll(".ap-line"), (l) => l.textContent).join("\n"); })()`))
		got = nonEmptyLines(screen)
		if strings.Join(got, "\n") == strings.Join(wantLines, "\n") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the player shows\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantLines, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func nonEmptyLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(strings.ReplaceAll(l, "\u00a0", " ")); l != "" {
			out = append(out, l)
		}
	}
	return out
}
