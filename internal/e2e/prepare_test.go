package e2e_test

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/chromedp/chromedp"
)

// TestBrowserSessionPreparation: the department's owner adds a skill on
// the agent's page by uploading its bundle (attached as upload:<name>,
// pinned to its hash, without editing JSON) and uploads a file, and the
// owner's new session, started from its page, lists the skill and the
// file verified by agentd. With
// -update-screenshots the session page becomes docs/screenshots/session.png.
func TestBrowserSessionPreparation(t *testing.T) {
	t.Parallel()
	w := newConsoleWorld(t)
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	f, _ := zw.Create("SKILL.md")
	_, _ = f.Write([]byte("# triage skill\n"))
	_ = zw.Close()
	dir := t.TempDir()
	bundle := filepath.Join(dir, "triage-skill.zip")
	brief := filepath.Join(dir, "brief.md")
	if err := os.WriteFile(bundle, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(brief, []byte("Triage the open issues.\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	bundleSum := hex.EncodeToString(sum[:])
	agentPage := w.srv.url + "/o/acme/agents/" + idStr(w.agentID)

	ctx := newBrowser(t)
	do(t, ctx, "sign in as the owner",
		chromedp.Navigate(w.srv.url+"/o/acme/login"),
		signIn(w.ownerEmail, w.pwd),
		chromedp.WaitVisible(testid("my-roles")),
	)
	t.Run("add a skill by uploading its bundle, and upload a file, on the agent's page", func(t *testing.T) {
		do(t, ctx, "open the agent", chromedp.Navigate(agentPage), chromedp.WaitVisible(testid("skills-empty")))
		// No JSON: the skill is added by uploading, which attaches the
		// bundle as upload:triage pinned to its hash (issue 41 item 5).
		do(t, ctx, "add the skill by upload",
			chromedp.SendKeys(css("#skill-name"), "triage"),
			chromedp.Click(testid("skill-kind-upload")),
			chromedp.WaitVisible(css("#skill-file")),
			chromedp.SetUploadFiles(css("#skill-file"), []string{bundle}),
			submits(chromedp.Click(testid("add-skill"))),
			chromedp.WaitVisible(testid("skill-triage")),
		)
		mustContain(t, "skill row", text(t, ctx, testid("skill-triage")), "upload:triage", bundleSum)
		mustContain(t, "bundle row", text(t, ctx, testid("upload-skill-triage")), bundleSum, "bytes")
		do(t, ctx, "upload the file",
			chromedp.SetValue(css("#upload-kind"), "file"),
			chromedp.SendKeys(css("#upload-name"), "notes/brief.md"),
			chromedp.SetUploadFiles(css("#upload-file"), []string{brief}),
			submits(chromedp.Click(testid("upload-submit"))),
			chromedp.WaitVisible(testid("upload-file-notes/brief.md")),
		)
	})
	// The world's agentd has no root of its own: the session's workspace
	// goes to a directory of this test, not the package's.
	callAPI(t, w.srv.url, http.MethodPatch, "/api/v1/orgs/acme/environments/"+idStr(w.envID), w.orgToken,
		map[string]any{"workspace_root": t.TempDir()}, http.StatusOK, nil)
	var ownerLogin struct{ Token string }
	callAPI(t, w.srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": w.ownerEmail, "password": w.pwd}, http.StatusOK, &ownerLogin)

	t.Run("a new session, started, lists them verified", func(t *testing.T) {
		do(t, ctx, "new session",
			chromedp.Navigate(agentPage),
			submits(chromedp.Click(testid("new-session"))),
			chromedp.WaitVisible(testid("session-start")),
		)
		if regexp.MustCompile(`/o/acme/sessions/\d+$`).FindString(get(t, ctx, "location", chromedp.Location())) == "" {
			t.Fatal("creating a session did not land on its page")
		}
		// Started elsewhere (a terminal, an agent's first exec): the
		// workspace panel follows without a reload (issue 41 item 4).
		mustContain(t, "panel before the start", text(t, ctx, testid("prep-empty")), "Nothing to prepare")
		sid := regexp.MustCompile(`\d+$`).FindString(get(t, ctx, "location", chromedp.Location()))
		callAPI(t, w.srv.url, http.MethodPost, "/api/v1/orgs/acme/sessions/"+sid+"/start", ownerLogin.Token, nil, http.StatusOK, nil)
		do(t, ctx, "wait for the preparation, live", chromedp.WaitVisible(testid("prep-table")))
		mustContain(t, "status", text(t, ctx, testid("prep-status")), "Prepared and verified")
		mustContain(t, "skill", text(t, ctx, testid("prep-skill-triage")), "verified", bundleSum, ".skills/triage")
		mustContain(t, "file", text(t, ctx, testid("prep-file-notes/brief.md")), "verified", "24 bytes")
		clickNow(t, ctx, "prepare again", "session-prepare")
		do(t, ctx, "wait for the retry", waitContains(testid("flash"), "is running"))
		mustContain(t, "status after the retry", text(t, ctx, testid("prep-status")), "Prepared and verified")
		if *updateScreenshots {
			do(t, ctx, "size the viewport", chromedp.EmulateViewport(1280, 1100))
			writeScreenshot(t, get(t, ctx, "screenshot", chromedp.CaptureScreenshot()), "session.png")
		}
	})
}

// clickNow clicks the element with data-testid id inside the page, in one
// step (the page may be replacing the node under chromedp's Click), and
// waits for the document the click navigates to; it fails when there is
// no such element.
func clickNow(t *testing.T, ctx context.Context, what, id string) {
	t.Helper()
	click := func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		ok, err := chromedp.Evaluate[bool](`(() => { const el = document.querySelector('[data-testid="`+id+`"]');
			if (!el) return false; el.click(); return true; })()`)(ctx, tg)
		if err == nil && !ok {
			return chromedp.Void{}, fmt.Errorf("no %s on the page", id)
		}
		return chromedp.Void{}, err
	}
	do(t, ctx, what, submits(click))
}
