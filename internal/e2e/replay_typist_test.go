package e2e_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestReplayMarksTypists: a member's command is typed into by the member,
// then by an org admin, then by the member again; the replay an auditor
// opens marks on the player's timeline where the typist changes, naming
// each. Issue 22, item 1.
func TestReplayMarksTypists(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	agentdURL, agentdToken := agentdtest.Start(t, agentdtest.WithRoot(t.TempDir()))
	var login struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
	acme := newRecOrg(t, srv, login.Token, "acme", agentdURL, agentdToken)
	base := fmt.Sprintf("/api/v1/orgs/acme/sessions/%d/commands", acme.session)
	var out struct {
		CommandID int64 `json:"command_id"`
	}
	callAPI(t, srv.url, http.MethodPost, base, acme.member, map[string]any{"command": "cat", "tty": true, "rows": 24, "cols": 80}, http.StatusCreated, &out)
	stdin := fmt.Sprintf("%s/%d/stdin", base, out.CommandID)
	for _, w := range []struct{ token, text string }{{acme.member, "from-mia\n"}, {acme.root, "from-the-admin\n"}, {acme.member, "mia-again\n"}} {
		callAPI(t, srv.url, http.MethodPost, stdin, w.token, map[string]any{"text": w.text}, http.StatusNoContent, nil)
	}
	callAPI(t, srv.url, http.MethodDelete, fmt.Sprintf("%s/%d", base, out.CommandID), acme.member, nil, http.StatusOK, nil)
	deadline := time.Now().Add(30 * time.Second)
	for ended := false; !ended; {
		var list struct {
			Items []struct {
				ID    int64
				State string
			}
		}
		callAPI(t, srv.url, http.MethodGet, base, acme.member, nil, http.StatusOK, &list)
		for _, c := range list.Items {
			ended = ended || c.ID == out.CommandID && c.State != "running"
		}
		if !ended && time.Now().After(deadline) {
			t.Fatal("the command never ended")
		}
		time.Sleep(100 * time.Millisecond)
	}

	ctx := newBrowser(t)
	do(t, ctx, "sign in as the auditor", chromedp.Navigate(srv.url+"/o/acme/login"), signIn(acme.auditorEmail, acme.password), chromedp.WaitVisible(testid("my-roles")))
	do(t, ctx, "open the replay", chromedp.Navigate(fmt.Sprintf("%s/o/acme/sessions/%d/commands/%d/replay", srv.url, acme.session, out.CommandID)),
		chromedp.WaitVisible(testid("replay")))
	// The admin is the platform administrator who entered the org.
	want := []string{"typist: mia@acme.test (user ", "typist: " + adminEmail + " (platform_admin ", "typist: mia@acme.test (user "}
	var marks []string
	for deadline := time.Now().Add(30 * time.Second); ; {
		marks = strings.Split(evalJS[string](t, ctx, "the player's markers", `Array.from(document.querySelectorAll(".ap-marker-container .ap-tooltip"), (m) => m.textContent).join("\n")`), "\n")
		if len(marks) == len(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the player shows markers %q, want one per change of typist", marks)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i, w := range want {
		if !strings.Contains(marks[i], w) {
			t.Fatalf("marker %d is %q, want it to name %q", i, marks[i], w)
		}
	}
}
