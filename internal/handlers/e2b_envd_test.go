package handlers_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/e2b"
	"github.com/gatehouse/gatehouse/internal/e2b/gen/filesystem"
	"github.com/gatehouse/gatehouse/internal/e2b/gen/filesystem/filesystemconnect"
	"github.com/gatehouse/gatehouse/internal/e2b/gen/process"
	"github.com/gatehouse/gatehouse/internal/e2b/gen/process/processconnect"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// envdSandbox is a sandbox the test resolver knows: its access token and
// the session (and principal) it binds to.
type envdSandbox struct {
	org, bearer, token string
	session            int64
}

// envdFixture is a terminal fixture whose console's data plane resolves
// the sandboxes of sandboxes, and an HTTP client that reaches the
// console whatever Host a URL names (the SDK's 49983-<id>.<domain>).
type envdFixture struct {
	*terminalFixture
	sandboxes map[string]envdSandbox
	http      *http.Client
	addr      string
}

func newEnvdFixture(t *testing.T, d store.Dialect) *envdFixture {
	t.Helper()
	f := &envdFixture{terminalFixture: newTerminalFixture(t, d), sandboxes: map[string]envdSandbox{}}
	f.addr = strings.TrimPrefix(f.e.srv.URL, "http://")
	f.sandboxes["sbxacme1"] = envdSandbox{org: "acme", bearer: f.tokens["member"], token: "envd-token-acme", session: f.session}
	// Another org's sandbox: its token is its own.
	f.sandboxes["sbxglobex1"] = envdSandbox{org: "globex", bearer: f.tokens["globex-admin"], token: "envd-token-globex", session: 1}
	f.e.c.Envd.Resolver = e2b.ResolverFunc(func(ctx context.Context, id, token string) (e2b.Binding, error) {
		// As the control plane's resolver: an unknown id reads as a wrong
		// token.
		sb, ok := f.sandboxes[id]
		if !ok || token != sb.token {
			return e2b.Binding{}, apperr.New(apperr.ErrUnauthorized, "unauthenticated", "The access token is missing or wrong.")
		}
		return f.e.c.Server.EnvdBinding(ctx, sb.org, sb.bearer, sb.session)
	})
	dial := &net.Dialer{}
	f.http = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return dial.DialContext(ctx, network, f.addr)
	}}}
	t.Cleanup(f.http.CloseIdleConnections)
	return f
}

// hostURL is sandbox id's envd URL by Host, as the SDK builds it.
func (f *envdFixture) hostURL(id string) string {
	return "http://" + e2b.HostPrefix + id + ".e2b.test"
}

// envdAuth sets the sandbox's headers on every call of a client.
type envdAuth struct {
	token, sandbox string
}

func (a envdAuth) set(h http.Header) {
	if a.token != "" {
		h.Set("X-Access-Token", a.token)
	}
	if a.sandbox != "" {
		h.Set(e2b.SandboxHeader, a.sandbox)
	}
	h.Set("Authorization", "Basic dXNlcjo=") // "user:", as the SDK sends
}

func (a envdAuth) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		a.set(req.Header())
		return next(ctx, req)
	}
}

func (a envdAuth) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, s connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, s)
		a.set(conn.RequestHeader())
		return conn
	}
}

func (a envdAuth) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func (f *envdFixture) process(base string, a envdAuth) processconnect.ProcessClient {
	return processconnect.NewProcessClient(f.http, base, connect.WithProtoJSON(), connect.WithInterceptors(a))
}

func (f *envdFixture) filesystem(base string, a envdAuth) filesystemconnect.FilesystemClient {
	return filesystemconnect.NewFilesystemClient(f.http, base, connect.WithProtoJSON(), connect.WithInterceptors(a))
}

// events collects a process stream's events until its end.
type events struct {
	pid    uint32
	stdout []string // one entry per data event
	end    *process.ProcessEvent_EndEvent
}

func readAll(t *testing.T, s *connect.ServerStreamForClient[process.StartResponse]) events {
	t.Helper()
	var ev events
	for s.Receive() {
		switch e := s.Msg().GetEvent().GetEvent().(type) {
		case *process.ProcessEvent_Start:
			ev.pid = e.Start.GetPid()
		case *process.ProcessEvent_Data:
			ev.stdout = append(ev.stdout, string(e.Data.GetStdout()))
		case *process.ProcessEvent_End:
			ev.end = e.End
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	return ev
}

func startCmd(script string, stdin bool) *connect.Request[process.StartRequest] {
	return connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}}, Stdin: &stdin})
}

func wantCode(t *testing.T, what string, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("%s: got %v (code %v), want %v", what, err, connect.CodeOf(err), code)
	}
}

// TestE2BDataPlane drives envd's API on the console with connect-go's own
// client, as the E2B SDK does (JSON codec, HTTP/1.1): every call is
// carried out by the audited gateway on a real agentd.
func TestE2BDataPlane(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newEnvdFixture(t, d)
		good := envdAuth{token: "envd-token-acme"}
		proc := f.process(f.hostURL("sbxacme1"), good)
		ctx := context.Background()

		t.Run("Start streams the output and the exit, audited and recorded", func(t *testing.T) {
			s, err := proc.Start(ctx, startCmd("echo hi", false))
			if err != nil {
				t.Fatal(err)
			}
			ev := readAll(t, s)
			if ev.pid == 0 || strings.Join(ev.stdout, "") != "hi\n" || ev.end == nil || !ev.end.GetExited() || ev.end.GetExitCode() != 0 {
				t.Fatalf("events: %+v", ev)
			}
			found := false
			for _, e := range f.auditEvents(t, "action:command.exec") {
				found = found || e.Details["command"] == "echo hi"
			}
			if !found {
				t.Fatal("no command.exec audit event for echo hi")
			}
			r := f.call(http.MethodGet, f.sessionPath("/commands"), "member", nil)
			wantStatus(t, "history", r, http.StatusOK)
			if !bytes.Contains(r.body, []byte(`"command":"echo hi"`)) {
				t.Fatalf("echo hi is not in the session's recorded commands: %s", r.body)
			}
		})

		t.Run("each line is its own event, sent before the next is printed", func(t *testing.T) {
			// The command prints a line, then waits for input before the
			// next: a line that reached the client in an event is proof
			// the stream did not hold it back for more output.
			s, err := proc.Start(ctx, startCmd("for i in 1 2 3; do echo $i; read x; done", true))
			if err != nil {
				t.Fatal(err)
			}
			var lines []string
			var pid uint32
			for s.Receive() {
				switch e := s.Msg().GetEvent().GetEvent().(type) {
				case *process.ProcessEvent_Start:
					pid = e.Start.GetPid()
				case *process.ProcessEvent_Data:
					lines = append(lines, string(e.Data.GetStdout()))
					_, err := proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
						Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
						Input:   &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("go\n")}}}))
					if err != nil {
						t.Fatalf("SendInput: %v", err)
					}
				case *process.ProcessEvent_End:
					if !e.End.GetExited() || e.End.GetExitCode() != 0 {
						t.Fatalf("end %+v", e.End)
					}
				}
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
			if strings.Join(lines, "|") != "1\n|2\n|3\n" {
				t.Fatalf("data events %q, want one per line in order", lines)
			}
		})

		t.Run("a command the policy denies is refused naming the pattern and never reaches agentd", func(t *testing.T) {
			before := f.agentd.requests.Load()
			s, err := proc.Start(ctx, startCmd("rm -rf /tmp/nothing", false))
			if err == nil {
				for s.Receive() {
				}
				err = s.Err()
			}
			wantCode(t, "denied start", err, connect.CodePermissionDenied)
			if !strings.Contains(err.Error(), "^rm -rf /") {
				t.Fatalf("the refusal does not name the pattern: %v", err)
			}
			if n := f.agentd.requests.Load(); n != before {
				t.Fatalf("agentd got %d requests for a denied command", n-before)
			}
			denied := false
			for _, e := range f.auditEvents(t, "action:authz.deny") {
				rule, _ := e.Details["rule"].(string)
				denied = denied || strings.Contains(rule, "execution policy") && strings.Contains(rule, "^rm -rf /")
			}
			if !denied {
				t.Fatal("the refusal is not in the audit log")
			}
		})

		t.Run("Start is decided by the execution rules: deny names the rule, ask holds the stream until decided", func(t *testing.T) {
			r := f.call(http.MethodPatch, "/agents/"+itoa(f.agentID), "entered-admin", map[string]any{"exec_policy": map[string]any{
				"rules": []map[string]string{{"action": "deny", "program": "shred"}, {"action": "ask", "program": "git", "args": "push *"}}}})
			wantStatus(t, "set the execution policy", r, http.StatusOK)
			before := f.agentd.requests.Load()
			s, err := proc.Start(ctx, startCmd("cd /tmp && sudo shred -u x", false))
			if err == nil {
				for s.Receive() {
				}
				err = s.Err()
			}
			wantCode(t, "shred", err, connect.CodePermissionDenied)
			if !strings.Contains(err.Error(), "rule 1: deny program shred") {
				t.Errorf("shred: refusal %v does not name the rule", err)
			}
			// An ask holds the Start until a person decides: denied, it
			// ends PermissionDenied naming the denial; nothing reached
			// agentd meanwhile.
			held := func(script string) <-chan error {
				done := make(chan error, 1)
				go func() {
					s, err := proc.Start(ctx, startCmd(script, false))
					if err == nil {
						started, ended := false, false
						for s.Receive() {
							started = started || s.Msg().GetEvent().GetStart() != nil
							ended = ended || s.Msg().GetEvent().GetEnd() != nil
						}
						if err = s.Err(); err == nil && (!started || !ended) {
							err = fmt.Errorf("started %v, ended %v", started, ended)
						}
					}
					done <- err
				}()
				return done
			}
			pending := func(command string) int64 {
				t.Helper()
				for range 300 {
					r := f.call(http.MethodGet, "/approvals?state=pending", "owner", nil)
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
			decide := func(id int64, decision string) {
				t.Helper()
				r := f.call(http.MethodPost, fmt.Sprintf("/approvals/%d/decision", id), "owner", map[string]any{"decision": decision, "scope": "once", "reason": "checked"})
				wantStatus(t, decision, r, http.StatusOK)
			}
			done := held("git push origin main")
			id := pending("git push origin main")
			time.Sleep(300 * time.Millisecond) // the Start is still held
			select {
			case err := <-done:
				t.Fatalf("Start answered %v before a decision", err)
			default:
			}
			if n := f.agentd.requests.Load(); n != before {
				t.Fatalf("agentd got %d requests for refused and held starts", n-before)
			}
			decide(id, "deny")
			err = <-done
			wantCode(t, "denied git push", err, connect.CodePermissionDenied)
			if !strings.Contains(err.Error(), "denied approval") {
				t.Errorf("denied Start: %v", err)
			}
			// Approved, it starts and streams to its end.
			done = held("git push origin approved")
			decide(pending("git push origin approved"), "approve")
			if err := <-done; err != nil {
				t.Errorf("approved Start: %v", err)
			}
		})

		t.Run("SendSignal ends a running process, audited as command.kill", func(t *testing.T) {
			s := startedProcess(t, ctx, proc, startCmd("sleep 300", false))
			pid := s.Msg().GetEvent().GetStart().GetPid()
			list, err := proc.List(ctx, connect.NewRequest(&process.ListRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			listed := false
			for _, p := range list.Msg.GetProcesses() {
				listed = listed || p.GetPid() == pid
			}
			if !listed {
				t.Fatalf("pid %d not in List: %v", pid, list.Msg)
			}
			if _, err := proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
				Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
				t.Fatal(err)
			}
			var end *process.ProcessEvent_EndEvent
			for s.Receive() {
				if e := s.Msg().GetEvent().GetEnd(); e != nil {
					end = e
				}
			}
			if end == nil || end.GetExited() {
				t.Fatalf("end after the kill: %+v (%v)", end, s.Err())
			}
			if len(f.auditEvents(t, "action:command.kill")) == 0 {
				t.Fatal("no command.kill audit event")
			}
		})

		t.Run("a sandbox's open streams are capped; one past the cap runs nothing", func(t *testing.T) {
			if e2b.DefaultMaxStreams != 100 {
				t.Fatalf("docs/e2b-endpoint.md says 100 streams per sandbox; the default is %d", e2b.DefaultMaxStreams)
			}
			f.e.c.Envd.MaxStreams = 2
			defer func() { f.e.c.Envd.MaxStreams = 0 }()
			var pids []uint32
			for range 2 {
				s := startedProcess(t, ctx, proc, startCmd("sleep 300", false))
				pids = append(pids, s.Msg().GetEvent().GetStart().GetPid())
			}
			s, err := proc.Start(ctx, startCmd("echo past-the-cap", false))
			if err == nil {
				for s.Receive() {
				}
				err = s.Err()
			}
			wantCode(t, "a third Start", err, connect.CodeResourceExhausted)
			c, err := proc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pids[0]}}}))
			if err == nil {
				for c.Receive() {
				}
				err = c.Err()
			}
			wantCode(t, "a Connect past the cap", err, connect.CodeResourceExhausted)
			for _, e := range f.auditEvents(t, "action:command.exec") {
				if cmd, _ := e.Details["command"].(string); strings.Contains(cmd, "past-the-cap") {
					t.Fatal("the refused Start ran its command")
				}
			}
			for _, pid := range pids {
				if _, err := proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
					Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
					t.Fatal(err)
				}
			}
		})

		t.Run("StreamInput feeds a process in order; a tag selector is unimplemented", func(t *testing.T) {
			s := startedProcess(t, ctx, proc, startCmd("read a; read b; echo $a$b", true))
			sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: s.Msg().GetEvent().GetStart().GetPid()}}
			in := proc.StreamInput(ctx)
			in.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: sel}}})
			for _, x := range []string{"x\n", "y\n"} {
				in.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{
					Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(x)}}}}})
			}
			if _, err := in.CloseAndReceive(); err != nil {
				t.Fatalf("StreamInput: %v", err)
			}
			var out strings.Builder
			for s.Receive() {
				out.Write(s.Msg().GetEvent().GetData().GetStdout())
			}
			if out.String() != "xy\n" {
				t.Fatalf("output %q", out.String())
			}
			_, err := proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
				Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "t"}},
				Input:   &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("z")}}}))
			wantCode(t, "a tag selector", err, connect.CodeUnimplemented)
		})

		t.Run("Update resizes a pty process", func(t *testing.T) {
			rows := &process.PTY{Size: &process.PTY_Size{Rows: 20, Cols: 70}}
			req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "read x; stty size"}}, Pty: rows})
			s := startedProcess(t, ctx, proc, req)
			sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: s.Msg().GetEvent().GetStart().GetPid()}}
			if _, err := proc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: sel, Pty: &process.PTY{Size: &process.PTY_Size{Rows: 33, Cols: 99}}})); err != nil {
				t.Fatal(err)
			}
			if _, err := proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel,
				Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte("\r")}}})); err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			for s.Receive() {
				out.Write(s.Msg().GetEvent().GetData().GetPty())
			}
			if !strings.Contains(out.String(), "33 99") {
				t.Fatalf("pty output after the resize: %q", out.String())
			}
		})

		t.Run("a quiet stream sends keepalive events at the asked interval", func(t *testing.T) {
			req := startCmd("read x; echo got $x", true)
			req.Header().Set("Keepalive-Ping-Interval", "1")
			s, err := proc.Start(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			var pid uint32
			var kinds []string
			for s.Receive() {
				switch e := s.Msg().GetEvent().GetEvent().(type) {
				case *process.ProcessEvent_Start:
					pid = e.Start.GetPid()
					kinds = append(kinds, "start")
				case *process.ProcessEvent_Keepalive:
					if kinds[len(kinds)-1] == "keepalive" {
						continue
					}
					kinds = append(kinds, "keepalive")
					// The command waits for this input: the keepalive came
					// while it had nothing to say.
					if _, err := proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
						Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
						Input:   &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("it\n")}}})); err != nil {
						t.Fatal(err)
					}
				case *process.ProcessEvent_Data:
					kinds = append(kinds, string(e.Data.GetStdout()))
				case *process.ProcessEvent_End:
					kinds = append(kinds, "end")
				}
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
			if strings.Join(kinds, "|") != "start|keepalive|got it\n|end" {
				t.Fatalf("events %q", kinds)
			}
		})

		t.Run("Connect re-attaches to a running process; CloseStdin ends its input", func(t *testing.T) {
			s := startedProcess(t, ctx, proc, startCmd("cat", true))
			sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: s.Msg().GetEvent().GetStart().GetPid()}}
			if _, err := proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel,
				Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("typed\n")}}})); err != nil {
				t.Fatal(err)
			}
			again, err := proc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: sel}))
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			var end *process.ProcessEvent_EndEvent
			for again.Receive() {
				ev := again.Msg().GetEvent()
				out.Write(ev.GetData().GetStdout())
				if out.String() == "typed\n" && end == nil {
					// Seen by the re-attached stream: now end the input.
					if _, err := proc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel})); err != nil {
						t.Fatal(err)
					}
					out.WriteString("|")
				}
				if ev.GetEnd() != nil {
					end = ev.GetEnd()
				}
			}
			if err := again.Err(); err != nil {
				t.Fatal(err)
			}
			if out.String() != "typed\n|" || end == nil || !end.GetExited() || end.GetExitCode() != 0 {
				t.Fatalf("re-attached output %q, end %+v", out.String(), end)
			}
			for s.Receive() {
			}
		})

		t.Run("files written and read back, by octet-stream, multipart and gzip", func(t *testing.T) {
			base := f.hostURL("sbxacme1")
			post := func(body io.Reader, ct, enc, query string) {
				t.Helper()
				req, _ := http.NewRequest(http.MethodPost, base+"/files?"+query, body)
				req.Header.Set("Content-Type", ct)
				if enc != "" {
					req.Header.Set("Content-Encoding", enc)
				}
				good.set(req.Header)
				resp, err := f.http.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"type":"file"`)) {
					t.Fatalf("POST /files: %d %s", resp.StatusCode, b)
				}
			}
			read := func(p string) string {
				t.Helper()
				req, _ := http.NewRequest(http.MethodGet, base+"/files?path="+url.QueryEscape(p), nil)
				good.set(req.Header)
				resp, err := f.http.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("GET /files: %d %s", resp.StatusCode, b)
				}
				return string(b)
			}
			post(strings.NewReader("plain 'quoted' $HOME\n"), "application/octet-stream", "", "path=notes/a+b.txt")
			var form bytes.Buffer
			mw := multipart.NewWriter(&form)
			w, _ := mw.CreateFormFile("file", "notes/m.txt")
			w.Write([]byte("from a form"))
			mw.Close()
			post(&form, mw.FormDataContentType(), "", "path=notes/m.txt")
			// Several files in one form (the SDK's files.write([...])): no
			// path in the query, each part's file name is its whole path.
			var multi bytes.Buffer
			mw = multipart.NewWriter(&multi)
			for _, p := range []string{"notes/deep/one.txt", "notes/deep/two.txt"} {
				w, _ := mw.CreateFormFile("file", p)
				w.Write([]byte("at " + p))
			}
			mw.Close()
			post(&multi, mw.FormDataContentType(), "", "")
			for _, p := range []string{"notes/deep/one.txt", "notes/deep/two.txt"} {
				if got := read(p); got != "at "+p {
					t.Fatalf("%s read back %q", p, got)
				}
			}
			var gz bytes.Buffer
			zw := gzip.NewWriter(&gz)
			zw.Write([]byte("zipped"))
			zw.Close()
			post(&gz, "application/octet-stream", "gzip", "path=notes/z.txt")
			for p, want := range map[string]string{"notes/a b.txt": "plain 'quoted' $HOME\n", "notes/m.txt": "from a form", "notes/z.txt": "zipped"} {
				if got := read(p); got != want {
					t.Fatalf("%s read back %q, want %q", p, got, want)
				}
			}
			st, err := f.filesystem(base, good).Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "notes/z.txt"}))
			if err != nil {
				t.Fatal(err)
			}
			if st.Msg.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_FILE || st.Msg.GetEntry().GetSize() != 6 {
				t.Fatalf("stat %v", st.Msg)
			}
			if len(f.auditEvents(t, "action:file.read")) == 0 {
				t.Fatal("no file.read audit event")
			}
			if len(f.auditEvents(t, "action:file.stat")) == 0 {
				t.Fatal("no file.stat audit event")
			}
			// Each upload is the gateway's audited write: file.write with
			// the path, the decoded size and its SHA-256; never a command.
			want := map[string]string{"notes/a b.txt": "plain 'quoted' $HOME\n", "notes/m.txt": "from a form", "notes/z.txt": "zipped"}
			seen := map[string]bool{}
			for _, e := range f.auditEvents(t, "action:file.write") {
				p, _ := e.Details["path"].(string)
				for name, content := range want {
					sum := sha256.Sum256([]byte(content))
					if strings.HasSuffix(p, "/"+name) && e.Details["sha256"] == hex.EncodeToString(sum[:]) && e.Details["size"] == float64(len(content)) {
						seen[name] = true
					}
				}
			}
			if len(seen) != len(want) {
				t.Fatalf("file.write audited with the right size and SHA-256 for %v, want all of %v", seen, want)
			}
			for _, e := range f.auditEvents(t, "action:command.exec") {
				if c, _ := e.Details["command"].(string); strings.Contains(c, "notes/") {
					t.Fatalf("an upload ran as a command: %q", c)
				}
			}
		})

		t.Run("a gzip body that inflates past the write limit is refused, nothing written", func(t *testing.T) {
			// 64 MiB + 1 of zeros compresses to about 64 KiB.
			var gz bytes.Buffer
			zw := gzip.NewWriter(&gz)
			zeros := make([]byte, 1<<20)
			for range 64 {
				zw.Write(zeros)
			}
			zw.Write([]byte{0})
			zw.Close()
			req, _ := http.NewRequest(http.MethodPost, f.hostURL("sbxacme1")+"/files?path=bomb.bin", &gz)
			req.Header.Set("Content-Type", "application/octet-stream")
			req.Header.Set("Content-Encoding", "gzip")
			good.set(req.Header)
			resp, err := f.http.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadRequest || !bytes.Contains(b, []byte("write limit")) {
				t.Fatalf("POST /files of a gzip bomb: %d %s", resp.StatusCode, b)
			}
			for _, e := range f.auditEvents(t, "action:file.write") {
				if p, _ := e.Details["path"].(string); strings.HasSuffix(p, "/bomb.bin") {
					t.Fatalf("the refused upload was audited as written: %v", e.Details)
				}
			}
		})

		t.Run("a file larger than a read is refused before any byte is sent", func(t *testing.T) {
			s, err := proc.Start(ctx, startCmd("truncate -s 65M big.bin", false))
			if err != nil {
				t.Fatal(err)
			}
			if ev := readAll(t, s); ev.end == nil || ev.end.GetExitCode() != 0 {
				t.Fatalf("truncate: %+v", ev)
			}
			req, _ := http.NewRequest(http.MethodGet, f.hostURL("sbxacme1")+"/files?path=big.bin", nil)
			good.set(req.Header)
			resp, err := f.http.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "more than the 67108864") {
				t.Fatalf("GET a 65 MiB file: %d %s", resp.StatusCode, b)
			}
		})

		t.Run("filesystem calls without an audited operation answer unimplemented", func(t *testing.T) {
			_, err := f.filesystem(f.hostURL("sbxacme1"), good).ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "."}))
			wantCode(t, "ListDir", err, connect.CodeUnimplemented)
		})

		t.Run("a missing or wrong token, an unknown or another org's sandbox are refused", func(t *testing.T) {
			before := f.agentd.requests.Load()
			for _, c := range []struct {
				name string
				base string
				a    envdAuth
				code connect.Code
			}{
				{"missing token", f.hostURL("sbxacme1"), envdAuth{}, connect.CodeUnauthenticated},
				{"wrong token", f.hostURL("sbxacme1"), envdAuth{token: "envd-token-acme-x"}, connect.CodeUnauthenticated},
				{"unknown sandbox", f.hostURL("sbxnone"), good, connect.CodeUnauthenticated},
				{"another org's sandbox by Host", f.hostURL("sbxglobex1"), good, connect.CodeUnauthenticated},
				{"another org's sandbox by header", f.e.srv.URL, envdAuth{token: "envd-token-acme", sandbox: "sbxglobex1"}, connect.CodeUnauthenticated},
				// The Host names the sandbox; a header cannot move a call
				// to another one.
				{"header does not override Host", f.hostURL("sbxglobex1"), envdAuth{token: "envd-token-acme", sandbox: "sbxacme1"}, connect.CodeUnauthenticated},
			} {
				_, err := f.process(c.base, c.a).List(ctx, connect.NewRequest(&process.ListRequest{}))
				wantCode(t, c.name+": List", err, c.code)
				s, err := f.process(c.base, c.a).Start(ctx, startCmd("echo refused", false))
				if err == nil {
					for s.Receive() {
					}
					err = s.Err()
				}
				wantCode(t, c.name+": Start", err, c.code)
			}
			for _, c := range []struct {
				token  string
				status int
			}{{"", http.StatusUnauthorized}, {"nope", http.StatusUnauthorized}} {
				req, _ := http.NewRequest(http.MethodGet, f.hostURL("sbxacme1")+"/files?path=notes/z.txt", nil)
				envdAuth{token: c.token}.set(req.Header)
				resp, err := f.http.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != c.status {
					t.Fatalf("GET /files with token %q: %d", c.token, resp.StatusCode)
				}
			}
			for token, status := range map[string]int{"envd-token-acme": http.StatusNoContent, "nope": http.StatusBadGateway, "": http.StatusBadGateway} {
				req, _ := http.NewRequest(http.MethodGet, f.hostURL("sbxacme1")+"/health", nil)
				envdAuth{token: token}.set(req.Header)
				resp, err := f.http.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != status {
					t.Fatalf("/health with token %q: %d, want %d", token, resp.StatusCode, status)
				}
			}
			if n := f.agentd.requests.Load(); n != before {
				t.Fatalf("agentd got %d requests from refused calls", n-before)
			}
		})

		t.Run("the Python SDK's requests, framed by hand", func(t *testing.T) {
			// e2b (PyPI) builds the envd URL as https://49983-<id>.<domain>
			// (E2B_DOMAIN, or the answer's domain) or takes E2B_SANDBOX_URL
			// as it is, and sends every call with E2b-Sandbox-Id,
			// E2b-Sandbox-Port and X-Access-Token (connection_config.py,
			// sandbox_sync/main.py); Start is a Connect server stream of
			// 5-byte-prefixed JSON frames with Keepalive-Ping-Interval: 50.
			for _, base := range []string{f.hostURL("sbxacme1"), f.e.srv.URL} {
				body, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", "echo from python"}, "envs": map[string]string{}}, "stdin": false})
				frame := append([]byte{0, 0, 0, 0, 0}, body...)
				binary.BigEndian.PutUint32(frame[1:5], uint32(len(body)))
				req, _ := http.NewRequest(http.MethodPost, base+"/process.Process/Start", bytes.NewReader(frame))
				req.Header.Set("Content-Type", "application/connect+json")
				req.Header.Set("Connect-Protocol-Version", "1")
				req.Header.Set("E2b-Sandbox-Id", "sbxacme1")
				req.Header.Set("E2b-Sandbox-Port", "49983")
				req.Header.Set("X-Access-Token", "envd-token-acme")
				req.Header.Set("Keepalive-Ping-Interval", "50")
				req.Header.Set("Authorization", "Basic dXNlcjo=")
				resp, err := f.http.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				var frames []string
				var endStream string
				for {
					var head [5]byte
					if _, err := io.ReadFull(resp.Body, head[:]); err != nil {
						break
					}
					msg := make([]byte, binary.BigEndian.Uint32(head[1:]))
					if _, err := io.ReadFull(resp.Body, msg); err != nil {
						t.Fatal(err)
					}
					if head[0]&2 != 0 {
						endStream = string(msg)
						break
					}
					frames = append(frames, string(msg))
				}
				resp.Body.Close()
				all := strings.Join(frames, "\n")
				// bytes fields are base64 in protojson: "from python\n".
				if resp.StatusCode != http.StatusOK || endStream != "{}" || !strings.Contains(all, `"start"`) ||
					!strings.Contains(all, base64.StdEncoding.EncodeToString([]byte("from python\n"))) || !strings.Contains(all, `"exited":true`) {
					t.Fatalf("%s: %d, frames %s, end %s", base, resp.StatusCode, all, endStream)
				}
			}
		})

		t.Run("a sandbox's other ports are not served on the shared URL", func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, f.e.srv.URL+"/files?path=notes/z.txt", nil)
			good.set(req.Header)
			req.Header.Set("E2b-Sandbox-Id", "sbxacme1")
			req.Header.Set("E2b-Sandbox-Port", "3000")
			resp, err := f.http.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("port 3000 by header: %d", resp.StatusCode)
			}
		})

		t.Run("by the shared URL and the E2b-Sandbox-Id header", func(t *testing.T) {
			s, err := f.process(f.e.srv.URL, envdAuth{token: "envd-token-acme", sandbox: "sbxacme1"}).Start(ctx, startCmd("echo shared", false))
			if err != nil {
				t.Fatal(err)
			}
			if ev := readAll(t, s); strings.Join(ev.stdout, "") != "shared\n" {
				t.Fatalf("events %+v", ev)
			}
		})

		t.Run("a request diverted to the data plane never reaches the console's routes", func(t *testing.T) {
			// A valid sandbox and token, and a console sign-in that would
			// open these routes: the data plane serves envd's paths only.
			for _, c := range []struct{ method, url string }{
				{http.MethodGet, f.e.srv.URL + "/api/v1/orgs/acme/sessions"},
				{http.MethodPost, f.e.srv.URL + "/api/v1/orgs/acme/e2b-keys"},
				{http.MethodGet, f.hostURL("sbxacme1") + "/api/v1/orgs/acme/sessions"},
				{http.MethodGet, f.e.srv.URL + "/orgs/acme"},
			} {
				req, _ := http.NewRequest(c.method, c.url, strings.NewReader(`{"agent_id":1,"name":"x"}`))
				good.set(req.Header)
				req.Header.Set(e2b.SandboxHeader, "sbxacme1")
				req.Header.Set("Authorization", "Bearer "+f.tokens["member"])
				req.Header.Set("Content-Type", "application/json")
				resp, err := f.http.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusNotFound || !bytes.Contains(b, []byte(`"message":"envd's API has no `)) {
					t.Fatalf("%s %s with E2b-Sandbox-Id: %d %s, want the data plane's 404", c.method, c.url, resp.StatusCode, b)
				}
			}
		})
	})
}

// startedProcess starts req through proc and returns its stream once the
// start event (the process's pid, in Msg) arrived; the stream is closed
// when the test ends.
func startedProcess(t *testing.T, ctx context.Context, proc processconnect.ProcessClient, req *connect.Request[process.StartRequest]) *connect.ServerStreamForClient[process.StartResponse] {
	t.Helper()
	s, err := proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if !s.Receive() || s.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", s.Err())
	}
	return s
}
