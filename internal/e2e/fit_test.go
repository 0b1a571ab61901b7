package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

// Long values, as people type them: names that do not break at spaces,
// long addresses, a command whose output is one unbroken line.
const (
	longDept   = "Research-and-Development-for-the-Northern-Hemisphere-Operations"
	longAgent  = "incident-triage-and-remediation-assistant-for-production-clusters"
	longEnv    = "build-host-017.eu-central-1.compute.internal.acme-corporation.example"
	longEmail  = "maximilian.alexander.featherstonehaugh-cholmondeley@research.acme-corporation.example"
	longOutput = "printf 'no-break-%s\\n' $(seq -s - 1 120)"
)

// fitWorld is consoleWorld with an auditor, long names everywhere and
// commands with output in the member's session, so every page has its
// widest content: many columns, long words, recordings to search.
type fitWorld struct {
	*consoleWorld
	auditorEmail string
	// commands ran in the member's session, with output.
	commands []int64
}

func newFitWorld(t *testing.T) *fitWorld {
	t.Helper()
	w := &fitWorld{consoleWorld: newConsoleWorld(t), auditorEmail: "audrey@acme.test"}
	base := w.srv.url
	var dept, env, agent struct{ ID int64 }
	callAPI(t, base, http.MethodPost, "/api/v1/orgs/acme/departments", w.orgToken, map[string]string{"name": longDept,
		"description": "A description that goes on for a while, as descriptions do, naming every team in it."}, http.StatusCreated, &dept)
	agentdURL, agentdToken := agentdtest.Start(t)
	callAPI(t, base, http.MethodPost, "/api/v1/orgs/acme/environments", w.orgToken, map[string]any{"name": longEnv, "kind": "host",
		"department_id": dept.ID, "url": agentdURL, "os": "linux", "deployment": "cloud-vm", "agentd_token": agentdToken}, http.StatusCreated, &env)
	callAPI(t, base, http.MethodPost, "/api/v1/orgs/acme/agents", w.orgToken, map[string]any{"name": longAgent, "department_id": dept.ID,
		"description":  "Reads alerts, looks at the cluster and proposes a fix.",
		"config":       map[string]any{"model": "claude-sonnet-4-5-20250929-with-a-long-model-identifier", "system_prompt": strings.Repeat("Be careful. ", 40)},
		"sandbox_mode": "off", "environment_ids": []int64{env.ID, w.envID}, "default_environment_id": env.ID}, http.StatusCreated, &agent)
	w.addUserIn(t, longEmail, "Maximilian Alexander Featherstonehaugh-Cholmondeley", "member", fmt.Sprintf("dept:%d", dept.ID))
	w.addUserIn(t, w.auditorEmail, "Audrey Auditor", "auditor", "org")
	// Commands with output in the member's session, for the recordings
	// pages and the audit log's command events.
	var member struct{ Token string }
	callAPI(t, base, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": w.memberEmail, "password": w.pwd}, http.StatusOK, &member)
	cmds := fmt.Sprintf("/api/v1/orgs/acme/sessions/%d/commands", w.sessionID)
	for _, c := range []string{longOutput, "echo needle-in-the-haystack; ls -la /"} {
		var out struct {
			CommandID int64 `json:"command_id"`
		}
		callAPI(t, base, http.MethodPost, cmds, member.Token, map[string]any{"command": c, "tty": true, "rows": 24, "cols": 80, "wait_ms": 0}, http.StatusCreated, &out)
		waitCommandEnd(t, base, cmds, member.Token, out.CommandID)
		w.commands = append(w.commands, out.CommandID)
	}
	return w
}

// waitCommandEnd waits until the command's end is recorded.
func waitCommandEnd(t *testing.T, base, cmds, token string, id int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var list struct {
			Items []struct {
				ID    int64
				State string
			}
		}
		callAPI(t, base, http.MethodGet, cmds, token, nil, http.StatusOK, &list)
		for _, c := range list.Items {
			if c.ID == id && c.State != "running" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("command %d never ended", id)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// overflow is what a page measures: the document's width against the
// window's, and the visible controls and cells that lie outside the
// window (cut off inside a scrolling box, or off the page).
type overflow struct {
	Scroll  int      `json:"scroll"`
	Window  int      `json:"window"`
	Outside []string `json:"outside"`
	Title   string   `json:"title"`
}

const measureJS = `(() => {
	// brokenWord is the first run of up to 16 letters or digits in el that
	// the browser laid out on more than one line, or "".
	const brokenWord = (el) => {
		const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
		const range = document.createRange();
		for (let n = walk.nextNode(); n; n = walk.nextNode()) {
			for (const m of n.data.matchAll(/[\p{L}\p{N}]{2,16}/gu)) {
				range.setStart(n, m.index);
				range.setEnd(n, m.index + m[0].length);
				const tops = new Set();
				for (const r of range.getClientRects()) {
					if (r.width > 0) tops.add(Math.round(r.top));
				}
				if (tops.size > 1) return m[0];
			}
		}
		return "";
	};
	const W = document.documentElement.clientWidth;
	const outside = [];
	for (const el of document.querySelectorAll("main td, main th, main button, main a, main input, main select, main summary, header a, header button")) {
		if (!el.checkVisibility()) continue;
		const r = el.getBoundingClientRect();
		if (r.width === 0 || r.height === 0) continue;
		if (r.right > W + 1 || r.left < -1) {
			const id = el.getAttribute("data-testid") || el.getAttribute("data-label") || "";
			outside.push(el.tagName.toLowerCase() + (id ? "[" + id + "]" : "") + " " + JSON.stringify(el.textContent.trim().slice(0, 30)) +
				" at " + Math.round(r.left) + "–" + Math.round(r.right));
			if (outside.length >= 6) break;
			continue;
		}
		// A cell whose content is wider than the cell runs under its
		// neighbour (or is clipped): the Action-over-Target overlap.
		if ((el.tagName === "TD" || el.tagName === "TH") && el.scrollWidth > el.clientWidth + 1) {
			outside.push(el.tagName.toLowerCase() + " " + JSON.stringify(el.textContent.trim().slice(0, 30)) +
				" holds " + el.scrollWidth + " px in " + el.clientWidth);
			if (outside.length >= 6) break;
		}
		// A short word (a number, a state, a header) broken across lines
		// inside a cell: "Exi t", "13 7".
		if (el.tagName === "TD" || el.tagName === "TH") {
			const broken = brokenWord(el);
			if (broken) {
				const col = el.getAttribute("data-label") || el.className || "";
				outside.push(el.tagName.toLowerCase() + (col ? "[" + col + "]" : "") + " breaks the word " + JSON.stringify(broken) +
					" in " + JSON.stringify(el.textContent.trim().slice(0, 40)));
				if (outside.length >= 6) break;
			}
		}
	}
	return {scroll: document.documentElement.scrollWidth, window: W, outside, title: document.title};
})()`

// fitPages is every page route of the world, plus searches that fill the
// audit log's and the recordings' widest columns.
func fitPages(t *testing.T, w *fitWorld) []string {
	t.Helper()
	out := pageURLs(t, w.consoleWorld)
	// A command's replay and watch pages: the one with the long line.
	for _, p := range []string{"replay", "watch"} {
		out = append(out, fmt.Sprintf("/o/acme/sessions/%d/commands/%d/%s", w.sessionID, w.commands[0], p))
	}
	return append(out, "/o/acme/audit?q=action%3Asession.", "/o/acme/recordings?q=needle-in-the-haystack",
		"/o/acme/recordings?q=no-break", "/admin/audit?q=org")
}

// TestBrowserEveryPageFits is issue 26 item 17: at 390 px (a phone) and
// 1280 px (a laptop) no page is wider than the window and nothing on it
// (a cell, a button, a link, a field) lies outside the window, for every
// role on the pages it reaches, with long names and many columns; and no
// cell breaks a short word (issue 41 item 8: "Exi t", "13 7").
func TestBrowserEveryPageFits(t *testing.T) {
	t.Parallel()
	w := newFitWorld(t)
	pages := fitPages(t, w)
	roles := []struct{ name, email string }{
		{"platform admin in the org", ""},
		{"auditor", w.auditorEmail},
		{"department owner", w.ownerEmail},
		{"member", w.memberEmail},
	}
	for _, role := range roles {
		t.Run(role.name, func(t *testing.T) {
			// A browser per role: each walk gets the whole of newBrowser's
			// deadline, which one browser for all four would outlast on a
			// loaded machine.
			var ctx context.Context
			if role.email == "" {
				ctx = w.asPlatformAdmin(t)
			} else {
				ctx = w.asOrgUser(t, role.email)
			}
			for _, u := range pages {
				if role.email != "" && !strings.HasPrefix(u, "/o/") {
					continue // platform pages: the platform admin's walk
				}
				start := time.Now()
				do(t, ctx, "open "+u, chromedp.EmulateViewport(390, 860), chromedp.Navigate(w.srv.url+u), chromedp.WaitReady(css(`body`)))
				// One load, both widths: the page's CSS follows the
				// viewport. Loaded at the phone's width, as a phone does:
				// a terminal sizes itself once, to the width it opens at.
				for _, width := range []int{390, 1280} {
					do(t, ctx, "size the window", chromedp.EmulateViewport(int64(width), 860))
					m := evalJS[overflow](t, ctx, "measure "+u, measureJS)
					if m.Window != width {
						t.Fatalf("%s: the window is %d px wide, want %d", u, m.Window, width)
					}
					if m.Scroll > m.Window || len(m.Outside) > 0 {
						t.Errorf("%d px, %s (%s): page %d px wide; outside the window: %q", width, u, m.Title, m.Scroll, m.Outside)
					}
					if name := phoneShots[u]; *updateScreenshots && width == 390 && role.name == "auditor" && name != "" {
						writePhoneScreenshot(t, get(t, ctx, "screenshot "+u, chromedp.CaptureScreenshot()), name)
					}
				}
				if d := time.Since(start); d > 2*time.Second {
					t.Logf("%s took %v", u, d.Round(time.Millisecond))
				}
			}
		})
	}
}

// phoneShots are the pages whose 390 px rendering goes to
// docs/screenshots with -update-screenshots.
var phoneShots = map[string]string{
	"/o/acme/audit?q=action%3Asession.":           "audit-phone.png",
	"/o/acme/recordings?q=needle-in-the-haystack": "recordings-phone.png",
}

// writePhoneScreenshot writes a narrow screenshot to docs/screenshots.
func writePhoneScreenshot(t *testing.T, img []byte, name string) {
	t.Helper()
	cfg, err := png.DecodeConfig(bytes.NewReader(img))
	if err != nil || cfg.Width < 300 || cfg.Height < 300 {
		t.Fatalf("screenshot is not a usable PNG: %dx%d, %v", cfg.Width, cfg.Height, err)
	}
	out := filepath.Join("..", "..", "docs", "screenshots", name)
	if err := os.WriteFile(out, img, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%dx%d)", out, cfg.Width, cfg.Height)
}
