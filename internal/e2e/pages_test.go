package e2e_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// pageBudget is the most a page may load, images aside: its HTML with its
// own styles and scripts.
const pageBudget = 100 << 10

// pageURLs turns the console's GET page routes into addresses in w, with
// every path parameter filled in. Routes that answer with something other
// than a page (JSON, downloads, WebSockets) are left out.
func pageURLs(t *testing.T, w *consoleWorld) []string {
	t.Helper()
	params := map[string]string{
		"/users/:id": "/users/" + idStr(w.memberID), "/departments/:dept": "/departments/" + idStr(w.deptID),
		"/environments/:id": "/environments/" + idStr(w.envID), "/agents/:id": "/agents/" + idStr(w.agentID),
		"/sessions/:id": "/sessions/" + idStr(w.sessionID), ":org": "acme",
	}
	var out []string
	for _, r := range w.srv.c.Server.Routes() {
		p := r.Path
		if r.Method != http.MethodGet || strings.HasPrefix(p, "/api/") || strings.HasPrefix(p, "/static/") || strings.HasPrefix(p, "/e2b/") || strings.HasPrefix(p, "/downloads/") ||
			strings.Contains(p, "/ws") || strings.Contains(p, "export") || strings.Contains(p, "callback") ||
			strings.Contains(p, "/sso/start") || strings.Contains(p, "*") ||
			p == "/healthz" || p == "/readyz" || p == "/metrics" || p == "/" {
			continue
		}
		if p == "/docs/:name" {
			out = append(out, "/docs/agents", "/docs/audit-actions", "/docs/sessions")
			continue
		}
		for k, v := range params {
			p = strings.ReplaceAll(p, k, v)
		}
		if strings.Contains(p, ":") {
			t.Logf("not walked (no value for its parameter): %s", r.Path)
			continue
		}
		out = append(out, p)
	}
	return out
}

// TestBrowserEveryPageSameOriginAndSmall walks every page route as a
// platform admin inside the org: no page refers to another origin in any
// src, href or action, loads nothing from one, and stays under 100 KB
// without images. The vendored terminal and replay libraries, loaded only
// on a live terminal and on the replay page, are counted separately.
func TestBrowserEveryPageSameOriginAndSmall(t *testing.T) {
	t.Parallel()
	w := newConsoleWorld(t)
	ctx := w.asPlatformAdmin(t)
	urls := pageURLs(t, w)
	if len(urls) < 20 {
		t.Fatalf("only %d page routes found: %q", len(urls), urls)
	}
	type report struct {
		HTML      bool     `json:"html"`
		Foreign   []string `json:"foreign"`
		Bytes     int      `json:"bytes"`
		Vendor    int      `json:"vendor"`
		Resources []string `json:"resources"`
	}
	for _, u := range urls {
		do(t, ctx, "open "+u, chromedp.Navigate(w.srv.url+u), chromedp.WaitReady(css(`body`)))
		r := evalJS[report](t, ctx, "inspect "+u, `(() => {
			const origin = location.origin;
			const foreign = [];
			for (const el of document.querySelectorAll("[src], [href], form[action]")) {
				for (const attr of ["src", "href", "action"]) {
					const v = el.getAttribute(attr);
					if (v === null || v === "" || v.startsWith("#")) continue;
					const abs = new URL(v, location.href);
					if (abs.origin !== origin) foreign.push(el.tagName + " " + attr + "=" + v);
				}
			}
			const nav = performance.getEntriesByType("navigation")[0];
			let bytes = nav ? nav.decodedBodySize : document.documentElement.outerHTML.length;
			let vendor = 0;
			const resources = [];
			for (const e of performance.getEntriesByType("resource")) {
				if (new URL(e.name).origin !== origin) foreign.push("loaded " + e.name);
				if (e.initiatorType === "img" || /\.(png|svg|jpg|jpeg|gif|webp|ico)$/.test(e.name)) continue;
				resources.push(new URL(e.name).pathname + " " + e.decodedBodySize);
				if (e.name.includes("/static/vendor/")) vendor += e.decodedBodySize; else bytes += e.decodedBodySize;
			}
			return {html: document.contentType === "text/html", foreign, bytes, vendor, resources};
		})()`)
		if !r.HTML {
			continue
		}
		t.Logf("%-40s %6d bytes (+%d vendored) %v", u, r.Bytes, r.Vendor, r.Resources)
		if len(r.Foreign) > 0 {
			t.Errorf("%s refers to another origin: %q", u, r.Foreign)
		}
		if r.Bytes > pageBudget {
			t.Errorf("%s loads %d bytes without images, over the %d budget", u, r.Bytes, pageBudget)
		}
	}
}

// TestConsolePagesScreenshot renders the org home, an agent, a session and
// the audit log with some content; with -update-screenshots they become
// docs/screenshots/*.png.
func TestConsolePagesScreenshot(t *testing.T) {
	t.Parallel()
	w := newConsoleWorld(t)
	ctx := w.asPlatformAdmin(t)
	do(t, ctx, "size the window", chromedp.EmulateViewport(1280, 860))
	for _, p := range []struct{ path, ready, file string }{
		{"/o/acme/", "org-glance", "org-home.png"},
		{"/o/acme/agents/" + idStr(w.agentID), "agent-effective", "agent.png"},
		// session.png shows a prepared workspace: TestBrowserSessionPreparation.
		{"/o/acme/sessions/" + idStr(w.sessionID), "session-facts", ""},
		{"/o/acme/audit", "audit-table", "audit.png"},
	} {
		do(t, ctx, "open "+p.path, chromedp.Navigate(w.srv.url+p.path), chromedp.WaitVisible(testid(p.ready)))
		img := get(t, ctx, "screenshot "+p.path, chromedp.CaptureScreenshot())
		if *updateScreenshots && p.file != "" {
			writeScreenshot(t, img, p.file)
		}
	}
}
