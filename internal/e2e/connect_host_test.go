package e2e_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestBrowserConnectHost is issue 13's fourth journey. A department owner
// adds a host without inventing a token: the console generates one, shows
// it once with the commands that start agentd on Linux, macOS and
// Windows, and waits on the page, visibly, until the host answers. Test
// connection shows progress with its button disabled and colours the
// outcome. The token appears on no later page, in no audit record and in
// no log line.
//
// The host has no Go (issue 41 item 3): the Linux command, as the page
// shows it, runs with bash on a PATH without Go in an empty directory; it
// downloads agentd from the console, checks its SHA-256 and starts it, and
// the page then shows the host connected.
func TestBrowserConnectHost(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	serveAgentd, agentdSum := agentdBuilds(t)
	srv := newServerLog(t, store.SQLite, &logs, serveAgentd)
	ownerEmail, ownerPassword, deptID := deptOwnerOrg(t, srv)

	// The host's address, free until agentd starts there.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	hostURL := "http://" + addr

	ctx := newBrowser(t)
	do(t, ctx, "add a host leaving the token empty",
		chromedp.Navigate(srv.url+"/o/acme/environments"),
		signIn(ownerEmail, ownerPassword),
		chromedp.WaitVisible(testid("save-env")),
		chromedp.SetValue(css(`#kind`), "host"),
		chromedp.SendKeys(css(`#name`), "build-02"),
		chromedp.SetValue(css(`#department_id`), deptID),
		chromedp.SendKeys(css(`#url`), hostURL),
		submits(chromedp.Click(testid("save-env"))),
		chromedp.WaitVisible(testid("connect")),
	)
	token := text(t, ctx, testid("agentd-token"))
	if err := agentd.CheckToken(token); err != nil || len(token) < 32 {
		t.Fatalf("generated token %q: %v", token, err)
	}
	// agentd listens where the environment says (127.0.0.1), with a
	// directory of its own (issue 26 item 10), once downloaded from the
	// console and checked.
	linuxID, linuxPlatform := ownLinuxCommand()
	rest := " && chmod +x agentd && mkdir -p $HOME/gatehouse-agentd && AGENTD_TOKEN='" + token + "' ./agentd --listen " + addr + " --root $HOME/gatehouse-agentd"
	for _, c := range []struct{ id, want string }{
		{linuxID, "curl -fsSLo agentd " + srv.url + "/downloads/agentd/" + linuxPlatform + " && echo '" + agentdSum + " *agentd' | sha256sum -c" + rest},
		{"cmd-macos", "curl -fsSLo agentd " + srv.url + "/downloads/agentd/darwin-arm64 && echo '" + sha256Hex(standInBuild) + " *agentd' | shasum -a 256 -c" + rest},
		{"cmd-windows", "Invoke-WebRequest -UseBasicParsing -OutFile agentd.exe " + srv.url + "/downloads/agentd/windows-amd64; if ((Get-FileHash agentd.exe -Algorithm SHA256).Hash -ne '" +
			sha256Hex(standInBuild) + "') { Write-Error 'agentd.exe is not the build this console serves: download it again.' } else { " +
			`New-Item -ItemType Directory -Force "$env:USERPROFILE\gatehouse-agentd" | Out-Null; $env:AGENTD_TOKEN='` + token +
			`'; .\agentd.exe --listen ` + addr + ` --root "$env:USERPROFILE\gatehouse-agentd" }`},
	} {
		if got := text(t, ctx, testid(c.id)); got != c.want {
			t.Errorf("%s command is %q, want %q", c.id, got, c.want)
		}
	}
	linuxLine := text(t, ctx, testid(linuxID))
	mustContain(t, "platforms the console cannot serve", text(t, ctx, testid("connect-missing")), "serves no agentd for", "scripts/release-agentd")
	mustContain(t, "connect section", text(t, ctx, testid("connect")), "Linux", "macOS", "Windows", "shown only now")

	// Waiting, visibly: the page asks and says it has not heard back yet.
	do(t, ctx, "wait for a check", chromedp.WaitVisible(css(`[data-testid="connect-status"][data-state="pending"]`)))
	do(t, ctx, "a check ran", discard(chromedp.Poll[bool](`document.querySelector('[data-testid="connect-status"]').textContent.includes("checked")`)))
	mustContain(t, "waiting status", text(t, ctx, testid("connect-status")), "Waiting for agentd at "+hostURL, "checked")
	if *updateScreenshots {
		do(t, ctx, "size the viewport", chromedp.EmulateViewport(1200, 1100))
		writeScreenshot(t, get(t, ctx, "screenshot", chromedp.CaptureScreenshot()), "environment-connect.png")
		do(t, ctx, "reset the viewport", chromedp.ResetViewport())
	}

	// A reload while waiting: the commands stay, the token does not.
	do(t, ctx, "reload while waiting", chromedp.Reload(), chromedp.WaitVisible(testid("connect-status")))
	noSecretInPage(t, ctx, "environment page reloaded while waiting", token)
	mustContain(t, "command after a reload", text(t, ctx, testid("cmd-linux")), "<the token shown when the host was added>", "--listen "+addr)

	// A download that is not the build the page vouches for is never
	// started: the same line with another hash stops at the check.
	tampered := strings.Replace(linuxLine, agentdSum, sha256Hex(standInBuild), 1)
	check := exec.Command("bash", "-c", tampered)
	check.Dir, check.Env = t.TempDir(), []string{"PATH=" + hostPath, "HOME=" + t.TempDir(), "LANG=C"}
	if out, err := check.CombinedOutput(); err == nil || !strings.Contains(string(out), "FAILED") || strings.Contains(string(out), "agentd listening") {
		t.Errorf("the Linux command with a hash other than the download's: %v\n%s", err, out)
	}

	// The host runs the command the page showed with the token, on a PATH
	// without Go, in an empty directory: the page sees agentd answer.
	_, stopHost := startOnHostWithoutGo(t, linuxLine)
	do(t, ctx, "the host answers", chromedp.WaitVisible(css(`[data-testid="connect-status"][data-state="healthy"]`)))
	mustContain(t, "connected status", text(t, ctx, testid("connect-status")), "Connected", "build-02", "ms", "agentd")
	if b := text(t, ctx, css(`dl.facts [data-testid="status"]`)); b != "healthy" {
		t.Errorf("the health badge says %q once the host answered", b)
	}
	contrastAtLeast(t, ctx, `[data-testid="connect-status"]`, 4.5)

	// Shown once: a reload has neither the token nor the commands.
	do(t, ctx, "reload", chromedp.Reload(), chromedp.WaitVisible(testid("env-name")))
	noSecretInPage(t, ctx, "environment page after a reload", token)
	if get(t, ctx, "connect section", chromedp.Evaluate[bool](`!!document.querySelector('[data-testid="connect"]')`)) {
		t.Error("the connect section is still shown for a host that answered")
	}

	// Test connection: progress with the button disabled, then the outcome.
	testConnection := func(want string) string {
		t.Helper()
		do(t, ctx, "record the button's states", discard(chromedp.Evaluate[bool](`(() => {
			window.seen = [];
			const btn = document.querySelector('[data-testid="test-connection"]');
			const out = document.querySelector('[data-testid="test-result"]');
			new MutationObserver(() => seen.push((btn.disabled ? "disabled" : "enabled") + "/" + out.getAttribute("data-state") + "/" + btn.textContent))
				.observe(document.querySelector('.actions'), {attributes: true, subtree: true, childList: true, characterData: true});
			return true;
		})()`)),
			chromedp.Click(testid("test-connection")),
			chromedp.WaitVisible(css(`[data-testid="test-result"][data-state="`+want+`"]`)),
			chromedp.WaitEnabled(testid("test-connection")),
		)
		seen := get(t, ctx, "states seen", chromedp.Evaluate[[]string](`window.seen`))
		if !strings.Contains(strings.Join(seen, " "), "disabled/pending/Testing…") {
			t.Errorf("Test connection never showed progress with its button disabled; states: %q", seen)
		}
		if loc := get(t, ctx, "location", chromedp.Location()); !strings.Contains(loc, "/environments/") {
			t.Errorf("Test connection left the page for %s", loc)
		}
		contrastAtLeast(t, ctx, `[data-testid="test-result"]`, 4.5)
		return text(t, ctx, testid("test-result"))
	}
	mustContain(t, "healthy test", testConnection("healthy"), "Connected", "ms")
	stopHost()
	mustContain(t, "unreachable test", testConnection("unreachable"), "unreachable")
	if b := text(t, ctx, css(`dl.facts [data-testid="status"]`)); b != "unreachable" {
		t.Errorf("the health badge says %q after a failed test", b)
	}
	// Every outcome's colours, as the stylesheet sets them.
	for _, state := range []string{"healthy", "degraded", "unreachable", "pending"} {
		do(t, ctx, "show "+state, discard(chromedp.Evaluate[bool](fmt.Sprintf(`(() => {
			const p = document.createElement("p"); p.className = "outcome outcome-%[1]s"; p.id = "probe-%[1]s"; p.textContent = "%[1]s";
			document.querySelector("main").append(p); return true; })()`, state))))
		contrastAtLeast(t, ctx, "#probe-"+state, 4.5)
	}

	// Nowhere else: not in the audit log, not in the console's log.
	tn, err := srv.c.Tenants.Open(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	defer tn.Release()
	events, err := tn.Audit.Query(t.Context(), audit.Filter{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	created := false
	for _, e := range events {
		if strings.Contains(string(e.Details), token) || strings.Contains(e.Target.Name, token) {
			t.Errorf("audit event %s records the agentd token", e.Action)
		}
		created = created || e.Action == "environment.create"
	}
	if !created {
		t.Error("the environment's creation is not in the audit log")
	}
	if strings.Contains(logs.String(), token) {
		t.Error("the console's log contains the agentd token")
	}
}

// acmeOrg signs in to the platform API as the admin and creates the
// organization acme ("Acme Corp"); it returns the platform token.
func acmeOrg(t *testing.T, srv *server) string {
	t.Helper()
	var login struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/auth/login", "",
		map[string]string{"email": adminEmail, "password": adminPassword}, http.StatusOK, &login)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs", login.Token,
		map[string]string{"slug": "acme", "name": "Acme Corp"}, http.StatusCreated, nil)
	return login.Token
}

// deptOwnerOrg creates org acme with department Research and a department
// owner who has chosen their password, and returns how they sign in and
// the department's id.
func deptOwnerOrg(t *testing.T, srv *server) (email, password, deptID string) {
	t.Helper()
	email, password = "owner@acme.test", "a long and private passphrase"
	var entered struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/enter", acmeOrg(t, srv), nil, http.StatusOK, &entered)
	var dept struct{ ID int64 }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/departments", entered.Token, map[string]string{"name": "Research"}, http.StatusCreated, &dept)
	var owner struct {
		User            struct{ ID int64 }
		OneTimePassword string `json:"one_time_password"`
	}
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/users", entered.Token, map[string]string{"email": email}, http.StatusCreated, &owner)
	deptID = strconv.FormatInt(dept.ID, 10)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/roles", entered.Token,
		map[string]string{"subject": "user:" + strconv.FormatInt(owner.User.ID, 10), "role": "dept-owner", "domain": "dept:" + deptID}, http.StatusNoContent, nil)
	var own struct{ Token string }
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/login", "", map[string]string{"email": email, "password": owner.OneTimePassword}, http.StatusOK, &own)
	callAPI(t, srv.url, http.MethodPost, "/api/v1/orgs/acme/auth/password", own.Token,
		map[string]string{"current_password": owner.OneTimePassword, "new_password": password}, http.StatusNoContent, nil)
	return email, password, deptID
}

// contrastAtLeast checks the element's text against its background, and
// its border against the page's white, by the WCAG formula.
func contrastAtLeast(t *testing.T, ctx context.Context, sel string, text float64) {
	t.Helper()
	cs := get(t, ctx, "colours of "+sel, chromedp.Evaluate[[]string](`(() => { const s = getComputedStyle(document.querySelector(`+strconv.Quote(sel)+`));
		return [s.color, s.backgroundColor, s.borderTopColor]; })()`))
	fg, bg, border := rgb(t, cs[0]), rgb(t, cs[1]), rgb(t, cs[2])
	if r := contrast(fg, bg); r < text {
		t.Errorf("%s: text %s on %s has contrast %.2f:1, want at least %.1f:1", sel, cs[0], cs[1], r, text)
	}
	if r := contrast(border, [3]float64{255, 255, 255}); r < 3 {
		t.Errorf("%s: border %s against white has contrast %.2f:1, want at least 3:1", sel, cs[2], r)
	}
}

func rgb(t *testing.T, css string) [3]float64 {
	t.Helper()
	var c [3]float64
	if _, err := fmt.Sscanf(strings.ReplaceAll(css, ",", " "), "rgb(%f %f %f)", &c[0], &c[1], &c[2]); err != nil {
		t.Fatalf("colour %q: %v", css, err)
	}
	return c
}

func contrast(a, b [3]float64) float64 {
	lum := func(c [3]float64) float64 {
		var l [3]float64
		for i, v := range c {
			v /= 255
			if v <= 0.03928 {
				l[i] = v / 12.92
			} else {
				l[i] = math.Pow((v+0.055)/1.055, 2.4)
			}
		}
		return 0.2126*l[0] + 0.7152*l[1] + 0.0722*l[2]
	}
	la, lb := lum(a), lum(b)
	return (math.Max(la, lb) + 0.05) / (math.Min(la, lb) + 0.05)
}

// discard runs a and drops its value, for steps run only for their effect.
func discard[T any](a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := a(ctx, tg)
		return chromedp.Void{}, err
	}
}

// standInBuild is what the release directory of agentdBuilds holds for
// macOS and Windows: the page's commands for them are checked, not run.
const standInBuild = "a stand-in for a release build"

// agentdBuilds builds cmd/agentd as the binary the console serves for its
// own platform (a console's own executable is agentd under that name; a
// test's is not) and writes stand-ins for macOS and Windows to a release
// directory. It returns the option that serves both and the SHA-256 of
// the real build.
func agentdBuilds(t *testing.T) (func(*config.Config), string) {
	t.Helper()
	self := filepath.Join(t.TempDir(), "agentd")
	cmd := exec.Command("go", "build", "-o", self, "./cmd/agentd")
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/agentd: %v: %s", err, out)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range []string{"agentd-darwin-arm64", "agentd-windows-amd64.exe"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(standInBuild), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return func(c *config.Config) { c.AgentdSelf, c.AgentdDir = self, dir }, sha256Hex(string(b))
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// ownLinuxCommand is the test id of the command for this machine's Linux
// and its platform's name.
func ownLinuxCommand() (id, platform string) {
	if runtime.GOARCH == "amd64" {
		return "cmd-linux", "linux-amd64"
	}
	return "cmd-linux-" + runtime.GOARCH, "linux-" + runtime.GOARCH
}

// hostPath is the PATH of a host without Go: Go lives in /usr/local/go/bin
// here, never in these.
const hostPath = "/usr/bin:/bin"

// runOnHostWithoutGo runs line with bash as a fresh host would: in an
// empty directory, with its own HOME and a PATH without Go (checked
// first). Cleanup stops it and everything it started.
func runOnHostWithoutGo(t *testing.T, line string) (home string) {
	t.Helper()
	home, _ = startOnHostWithoutGo(t, line)
	return home
}

// startOnHostWithoutGo is runOnHostWithoutGo that also returns what
// stops the host's command early.
func startOnHostWithoutGo(t *testing.T, line string) (home string, stop func()) {
	t.Helper()
	dir := t.TempDir()
	home = t.TempDir()
	env := []string{"PATH=" + hostPath, "HOME=" + home, "LANG=C"}
	which := exec.Command("bash", "-c", "command -v go")
	which.Env = env
	if out, err := which.CombinedOutput(); err == nil {
		t.Fatalf("PATH=%s has go at %s", hostPath, out)
	}
	run := exec.Command("bash", "-c", line)
	run.Dir, run.Env = dir, env
	run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var logs lockedBuffer
	run.Stdout, run.Stderr = &logs, &logs
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			syscall.Kill(-run.Process.Pid, syscall.SIGKILL)
			run.Wait()
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("the host's command said:\n%s", logs.String())
		}
	})
	return home, stop
}
