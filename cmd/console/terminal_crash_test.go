package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// childEnv makes the test binary run as the console itself (main's run
// with the arguments given): the tests start it as a real child process and
// kill it, without a separate build of the same code.
const childEnv = "GATEHOUSE_TEST_CONSOLE_PROCESS"

// agentdBin is the real agentd, built once for the test binary.
var agentdBin e2bfaketest.Binary

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "console:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	e2bfaketest.Main(m, func(b e2bfaketest.Binary) { agentdBin = b })
}

const (
	crashAdminEmail    = "root@example.com"
	crashAdminPassword = "correct horse battery staple"
)

// consoleProcess is one run of the console as a child process.
type consoleProcess struct {
	cmd *exec.Cmd
	url string
	// logPath holds what the console logged (its stderr).
	logPath string
	done    chan struct{}
}

// logs is what the console logged so far.
func (p *consoleProcess) logs() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// consoleCmd is the test binary as `console args...` with env.
func consoleCmd(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	return cmd
}

// startConsole runs `console serve` with env and waits until it listens.
func startConsole(t *testing.T, env []string) *consoleProcess {
	t.Helper()
	p := &consoleProcess{cmd: consoleCmd(env, "serve", "--listen", "127.0.0.1:0"), logPath: filepath.Join(t.TempDir(), "console.log"), done: make(chan struct{})}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	p.cmd.Stderr = logFile
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if addr, ok := strings.CutPrefix(line, "Gatehouse console listening on "); ok {
				listening <- addr
			}
		}
	}()
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.kill(t) })
	select {
	case addr := <-listening:
		p.url = "http://" + addr
	case <-p.done:
		t.Fatalf("the console exited before listening:\n%s", p.logs())
	case <-time.After(60 * time.Second):
		t.Fatalf("the console did not listen within 60 s:\n%s", p.logs())
	}
	return p
}

// kill ends the console with SIGKILL: no shutdown code runs.
func (p *consoleProcess) kill(t *testing.T) {
	t.Helper()
	p.signal(t, syscall.SIGKILL)
}

// stop ends the console the way an operator does (SIGTERM).
func (p *consoleProcess) stop(t *testing.T) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
}

func (p *consoleProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the console did not exit after %s", sig)
	}
}

// api is a JSON client of one console run.
type api struct {
	t    *testing.T
	base string
}

func (a api) call(method, path, token string, in, out any) int {
	a.t.Helper()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			a.t.Fatal(err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, a.base+path, body)
	if err != nil {
		a.t.Fatal(err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	if resp.StatusCode >= 300 {
		a.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			a.t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
	return resp.StatusCode
}

// crashSetup is an org whose member has an API key and a session on a
// host running agentd.
type crashSetup struct {
	key     string // the member's API key (gh_...)
	session int64
}

func setUpSession(t *testing.T, a api, agentdURL, agentdToken string) crashSetup {
	t.Helper()
	var login struct{ Token string }
	a.call(http.MethodPost, "/api/v1/auth/login", "", map[string]string{"email": crashAdminEmail, "password": crashAdminPassword}, &login)
	a.call(http.MethodPost, "/api/v1/orgs", login.Token, map[string]string{"slug": "acme", "name": "Acme"}, nil)
	var entered struct{ Token string }
	a.call(http.MethodPost, "/api/v1/orgs/acme/enter", login.Token, nil, &entered)
	root, base := entered.Token, "/api/v1/orgs/acme"
	var dept, env, agent, sess struct{ ID int64 }
	a.call(http.MethodPost, base+"/departments", root, map[string]string{"name": "Research"}, &dept)
	var user struct {
		User            struct{ ID int64 }
		OneTimePassword string `json:"one_time_password"`
	}
	a.call(http.MethodPost, base+"/users", root, map[string]string{"email": "dev@acme.test", "name": "Dev"}, &user)
	a.call(http.MethodPost, base+"/roles", root, rbac.Assignment{Subject: fmt.Sprintf("user:%d", user.User.ID), Role: rbac.RoleMember, Domain: rbac.DeptDomain(dept.ID)}, nil)
	var ulogin struct{ Token string }
	a.call(http.MethodPost, base+"/auth/login", "", map[string]string{"email": "dev@acme.test", "password": user.OneTimePassword}, &ulogin)
	a.call(http.MethodPost, base+"/auth/password", ulogin.Token, map[string]string{"current_password": user.OneTimePassword, "new_password": "a-long-user-password"}, nil)
	var key struct{ Secret string }
	a.call(http.MethodPost, base+"/api-keys", ulogin.Token, map[string]string{"name": "runtime"}, &key)
	a.call(http.MethodPost, base+"/environments", root, map[string]any{"name": "build-host", "kind": "host", "department_id": dept.ID,
		"url": agentdURL, "os": "linux", "deployment": "bare-metal", "agentd_token": agentdToken}, &env)
	a.call(http.MethodPost, base+"/agents", root, map[string]any{"name": "coder", "department_id": dept.ID, "config": map[string]string{"model": "m"},
		"environment_ids": []int64{env.ID}}, &agent)
	a.call(http.MethodPost, base+"/sessions", key.Secret, map[string]any{"agent_id": agent.ID}, &sess)
	return crashSetup{key: key.Secret, session: sess.ID}
}

type output struct {
	CommandID  int64  `json:"command_id"`
	State      string `json:"state"`
	NextCursor uint64 `json:"next_cursor"`
	More       bool   `json:"more"`
	Chunks     []struct {
		ID     uint64 `json:"id"`
		Stream string `json:"stream"`
		Data   []byte `json:"data"`
	} `json:"chunks"`
}

// reader is a client following a command's output with a cursor.
type reader struct {
	cursor uint64
	stdout bytes.Buffer
}

// poll reads one batch; it reports whether the command is over.
func (r *reader) poll(t *testing.T, a api, s crashSetup, cid int64) bool {
	t.Helper()
	var o output
	a.call(http.MethodGet, fmt.Sprintf("/api/v1/orgs/acme/sessions/%d/commands/%d/output?cursor=%d&wait_ms=1000", s.session, cid, r.cursor), s.key, nil, &o)
	for _, ch := range o.Chunks {
		if ch.ID <= r.cursor {
			t.Fatalf("chunk %d again after cursor %d", ch.ID, r.cursor)
		}
		if ch.Stream == "stdout" {
			r.stdout.Write(ch.Data)
		}
		r.cursor = ch.ID
	}
	if o.NextCursor > r.cursor {
		r.cursor = o.NextCursor
	}
	return o.State != "running" && !o.More
}

// TestConsoleKilledMidCommand kills the console (SIGKILL, a real child
// process) while a command prints a counter: after a restart on the same
// data the client goes on from its cursor and reads every line exactly
// once, the recording (served once the command ended) holds every line
// exactly once, and `console audit verify` passes. Short follower leases
// let the restarted console adopt the command within seconds.
func TestConsoleKilledMidCommand(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		agentdToken := "agentd-token-" + randomHex(12)
		l := e2bfake.ExecLauncher{Binary: agentdBin.Path, Token: agentdToken, ExtraEnv: agentdBin.Env}
		ag, err := l.Launch(context.Background(), e2bfake.LaunchSpec{SandboxID: "host", Workspace: t.TempDir(), StateDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ag.Kill() })

		env := []string{"GATEHOUSE_DATA_DIR=" + t.TempDir(), "GATEHOUSE_ADMIN_EMAIL=" + crashAdminEmail, "GATEHOUSE_ADMIN_PASSWORD=" + crashAdminPassword,
			"GATEHOUSE_FOLLOWER_LEASE=2s", "GATEHOUSE_FOLLOWER_SWEEP_INTERVAL=300ms"}
		if d == store.Postgres {
			prefix := storetest.NewName("gh_test_org_") + "_"
			storetest.DropPrefixedAtCleanup(t, prefix)
			env = append(env, "DATABASE_URL="+storetest.DSN(t, store.Postgres), "GATEHOUSE_MASTER_KEY="+randomHex(32), "GATEHOUSE_ORG_DB_PREFIX="+prefix)
		}

		first := startConsole(t, env)
		a := api{t: t, base: first.url}
		s := setUpSession(t, a, "http://"+ag.Addr(), agentdToken)
		const lines = 300
		var o output
		a.call(http.MethodPost, fmt.Sprintf("/api/v1/orgs/acme/sessions/%d/commands", s.session), s.key,
			map[string]any{"command": fmt.Sprintf("for i in $(seq 1 %d); do echo $i; sleep 0.01; done", lines)}, &o)
		var rd reader
		for !strings.Contains(rd.stdout.String(), "\n20\n") {
			if rd.poll(t, a, s, o.CommandID) {
				t.Fatalf("the command ended before the console was killed: %q", rd.stdout.String())
			}
		}
		first.kill(t)

		second := startConsole(t, env)
		a.base = second.url
		for !rd.poll(t, a, s, o.CommandID) {
		}
		wantLines(t, "the client's output across the restart", rd.stdout.String(), lines)

		// Once the restarted console's follower recorded the end, the
		// output comes from the recording.
		deadline := time.Now().Add(60 * time.Second)
		for {
			var h struct {
				Items []struct {
					ID    int64  `json:"id"`
					State string `json:"state"`
				}
			}
			a.call(http.MethodGet, fmt.Sprintf("/api/v1/orgs/acme/sessions/%d/commands", s.session), s.key, nil, &h)
			if len(h.Items) == 1 && h.Items[0].ID == o.CommandID && h.Items[0].State == "exited" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the command is not recorded as ended: %+v\n%s", h, second.logs())
			}
			time.Sleep(100 * time.Millisecond)
		}
		var rec reader
		for !rec.poll(t, a, s, o.CommandID) {
		}
		wantLines(t, "the recording", rec.stdout.String(), lines)

		second.stop(t)
		var out bytes.Buffer
		verify := consoleCmd(env, "audit", "verify", "--org", "acme")
		verify.Stdout, verify.Stderr = &out, &out
		if err := verify.Run(); err != nil || !strings.HasPrefix(out.String(), "ok: ") {
			t.Fatalf("console audit verify --org acme: %v\n%s", err, out.String())
		}
		for name, b := range map[string]string{"first run's log": first.logs(), "second run's log": second.logs()} {
			if strings.Contains(b, agentdToken) {
				t.Errorf("the agentd token shows in the %s", name)
			}
		}
	})
}

// wantLines checks that out is the lines 1..n, each exactly once.
func wantLines(t *testing.T, what, out string, n int) {
	t.Helper()
	got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(got) == n {
		ok := true
		for i, l := range got {
			ok = ok && l == strconv.Itoa(i+1)
		}
		if ok {
			return
		}
	}
	count := map[string]int{}
	for _, l := range got {
		count[l]++
	}
	var wrong []string
	for i := 1; i <= n && len(wrong) < 20; i++ {
		if c := count[strconv.Itoa(i)]; c != 1 {
			wrong = append(wrong, fmt.Sprintf("%d×%d", i, c))
		}
	}
	t.Fatalf("%s is not the lines 1..%d once each in order (%d lines; line×count: %s)", what, n, len(got), strings.Join(wrong, " "))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
