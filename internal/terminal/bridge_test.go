package terminal_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/terminal"
)

// fakeOps is a gateway that records what the bridge forwards and answers
// polls from a script.
type fakeOps struct {
	mu    sync.Mutex
	calls []string
	// polls answers polls in order; a poll past the script waits for the
	// terminal to end.
	polls   chan gateway.Output
	refuse  map[string]error // by operation
	reason  string
	detach  chan string // the reason of Detach, and whether it saw the end
	cursors []uint64
}

func newFakeOps(outs ...gateway.Output) *fakeOps {
	o := &fakeOps{polls: make(chan gateway.Output, len(outs)+8), refuse: map[string]error{}, detach: make(chan string, 1)}
	for _, out := range outs {
		o.polls <- out
	}
	return o
}

func (o *fakeOps) record(format string, args ...any) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	call := fmt.Sprintf(format, args...)
	o.calls = append(o.calls, call)
	return o.refuse[strings.Fields(call)[0]]
}

func (o *fakeOps) recorded() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.calls)
}

func (o *fakeOps) Exec(_ context.Context, _ gateway.Org, _ *authz.Actor, _ gateway.Meta, sessionID int64, req gateway.ExecRequest) (gateway.Output, error) {
	if err := o.record("exec %d tty=%v shell=%v", sessionID, req.TTY, req.Command == terminal.ShellCommand); err != nil {
		return gateway.Output{}, err
	}
	return gateway.Output{CommandID: 42, State: agentd.StateRunning}, nil
}

func (o *fakeOps) OpenedTerminal(gateway.Org, *authz.Actor, int64) { _ = o.record("opened") }

func (o *fakeOps) Watch(_ context.Context, _ gateway.Org, _ *authz.Actor, _ gateway.Meta, _, cid int64) error {
	return o.record("watch %d", cid)
}

func (o *fakeOps) Continue(_ context.Context, _ gateway.Org, _ *authz.Actor, _, cid int64) error {
	return o.record("continue %d", cid)
}

func (o *fakeOps) Attach(_ context.Context, _ gateway.Org, _ *authz.Actor, _ gateway.Meta, _, cid int64) error {
	return o.record("attach %d", cid)
}

func (o *fakeOps) Detach(_ context.Context, _ gateway.Org, _ *authz.Actor, _ gateway.Meta, _, cid int64, reason string, ended bool) error {
	_ = o.record("detach %d ended=%v", cid, ended)
	o.detach <- reason
	return nil
}

func (o *fakeOps) Stdin(_ context.Context, _ gateway.Org, _ *authz.Actor, _ gateway.Meta, _, cid int64, data []byte, _ bool) error {
	return o.record("stdin %d %q", cid, data)
}

func (o *fakeOps) Resize(_ context.Context, _ gateway.Org, _ *authz.Actor, _ gateway.Meta, _, cid int64, rows, cols uint16) error {
	return o.record("resize %d %dx%d", cid, rows, cols)
}

func (o *fakeOps) Poll(ctx context.Context, _ gateway.Org, _ *authz.Actor, _, _ int64, cursor uint64, _ int64) (gateway.Output, error) {
	o.mu.Lock()
	o.cursors = append(o.cursors, cursor)
	err := o.refuse["poll"]
	o.mu.Unlock()
	if err != nil {
		return gateway.Output{}, err
	}
	select {
	case out := <-o.polls:
		return out, nil
	case <-ctx.Done():
		return gateway.Output{}, ctx.Err()
	}
}

func (o *fakeOps) EndReason(context.Context, gateway.Org, int64, int64) string { return o.reason }

// serve runs a bridge over ops behind a WebSocket and dials it; at's
// fields complete the attach (the session is 7).
func serve(t *testing.T, ops terminal.Operations, org gateway.Org, at terminal.Attach) (*websocket.Conn, <-chan error) {
	t.Helper()
	b := &terminal.Bridge{Gateway: ops}
	served := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			served <- err
			return
		}
		at.SessionID = 7
		served <- b.Serve(r.Context(), conn, org, authz.System("test"), gateway.Meta{}, at)
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, strings.Replace(srv.URL, "http://", "ws://", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	return c, served
}

// next reads the console's next message; a read past the connection's end
// is a message of type "closed" with the close reason.
func next(t *testing.T, c *websocket.Conn) terminal.ServerMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, b, err := c.Read(ctx)
	if err != nil {
		var ce websocket.CloseError
		if errors.As(err, &ce) {
			return terminal.ServerMessage{Type: "closed", Message: fmt.Sprintf("%d %s", ce.Code, ce.Reason)}
		}
		return terminal.ServerMessage{Type: "closed", Message: err.Error()}
	}
	var m terminal.ServerMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func send(t *testing.T, c *websocket.Conn, typ websocket.MessageType, v any) {
	t.Helper()
	b, ok := v.([]byte)
	if !ok {
		b, _ = json.Marshal(v)
	}
	if err := c.Write(context.Background(), typ, b); err != nil {
		t.Fatal(err)
	}
}

func chunk(id uint64, data string) agentd.Chunk {
	return agentd.Chunk{ID: id, Stream: agentd.StreamStdout, Data: []byte(data)}
}

// TestBridgeFrames walks the frames of a new shell: attached with the
// command started, output in order from the cursor (exec records pass it
// unsent), the end with what ended it, then a normal close; the command's
// end is seen, so the detach says so.
func TestBridgeFrames(t *testing.T) {
	t.Parallel()
	exit := 3
	ops := newFakeOps(
		gateway.Output{State: agentd.StateRunning, Chunks: []agentd.Chunk{chunk(1, "$ "), chunk(2, "ls\r\n")}, NextCursor: 2},
		gateway.Output{State: agentd.StateRunning, NextCursor: 5}, // exec records only
		gateway.Output{State: agentd.StateRunning, Chunks: []agentd.Chunk{chunk(5, "again"), chunk(6, "a.txt\r\n")}, NextCursor: 6},
		gateway.Output{State: agentd.StateExited, ExitCode: &exit, NextCursor: 6},
	)
	ops.reason = "session_close"
	c, served := serve(t, ops, gateway.Org{Slug: "acme"}, terminal.Attach{Rows: 24, Cols: 80})
	if m := next(t, c); m.Type != "attached" || m.CommandID != 42 || m.ReadOnly {
		t.Fatalf("first frame %+v, want attached to command 42", m)
	}
	var got []string
	for {
		m := next(t, c)
		if m.Type != "output" {
			if m.Type != "exit" || m.State != agentd.StateExited || *m.ExitCode != 3 || m.EndedBy != "session_close" {
				t.Fatalf("last frame %+v, want the exit, ended by the session's close", m)
			}
			break
		}
		got = append(got, fmt.Sprintf("%d:%s", m.ID, m.Data))
	}
	// The third answer repeats chunk 5 after the cursor moved past it on
	// exec records alone: it is not sent again.
	if want := []string{"1:$ ", "2:ls\r\n", "6:a.txt\r\n"}; !slices.Equal(got, want) {
		t.Fatalf("output frames %q, want %q", got, want)
	}
	if m := next(t, c); m.Type != "closed" || !strings.HasPrefix(m.Message, "1000 ") {
		t.Fatalf("after the exit: %+v, want a normal closure", m)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if why := <-ops.detach; why != "the command ended" {
		t.Fatalf("detach reason %q", why)
	}
	if calls := ops.recorded(); !slices.Equal(calls, []string{"exec 7 tty=true shell=true", "opened", "detach 42 ended=true"}) {
		t.Fatalf("operations %q", calls)
	}
	ops.mu.Lock()
	defer ops.mu.Unlock()
	if want := []uint64{0, 2, 5, 6}; !slices.Equal(ops.cursors, want) {
		t.Fatalf("polled from %v, want %v", ops.cursors, want)
	}
}

// TestBridgeForwardsInput: keystrokes and window changes are forwarded in
// order; empty input, impossible sizes, binary frames and nonsense are
// not; a window change of an ended command is no refusal; a lost
// connection is the detach's reason.
func TestBridgeForwardsInput(t *testing.T) {
	t.Parallel()
	ops := newFakeOps()
	ops.refuse["resize"] = nil
	c, served := serve(t, ops, gateway.Org{Slug: "acme"}, terminal.Attach{CommandID: 9, Cursor: 4})
	if m := next(t, c); m.Type != "attached" || m.CommandID != 9 {
		t.Fatalf("first frame %+v", m)
	}
	for _, m := range []any{
		terminal.ClientMessage{Type: "input", Data: "ls\r"},
		terminal.ClientMessage{Type: "input"},
		terminal.ClientMessage{Type: "resize", Rows: 0, Cols: 80},
		terminal.ClientMessage{Type: "resize", Rows: 24, Cols: 5000},
		terminal.ClientMessage{Type: "paste", Data: "x"},
		[]byte("{not json"),
		terminal.ClientMessage{Type: "resize", Rows: 50, Cols: 120},
		terminal.ClientMessage{Type: "input", Data: "exit\r"},
	} {
		send(t, c, websocket.MessageText, m)
	}
	send(t, c, websocket.MessageBinary, []byte(`{"type":"input","data":"binary"}`))
	want := []string{"continue 9", "attach 9", `stdin 9 "ls\r"`, "resize 9 50x120", `stdin 9 "exit\r"`}
	for deadline := time.Now().Add(30 * time.Second); !slices.Equal(ops.recorded(), want); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("operations %q, want %q", ops.recorded(), want)
		}
	}
	_ = c.CloseNow() // the network lost
	if why := <-ops.detach; why != "the connection was lost" {
		t.Fatalf("detach reason %q", why)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	ops.mu.Lock()
	defer ops.mu.Unlock()
	if ops.cursors[0] != 4 {
		t.Fatalf("first poll from %d, want the reconnecting cursor 4", ops.cursors[0])
	}
}

// TestBridgeWatch: a watching terminal forwards nothing it is sent and is
// not detached (it never attached); one naming no command is refused.
func TestBridgeWatch(t *testing.T) {
	t.Parallel()
	t.Run("keystrokes go nowhere", func(t *testing.T) {
		t.Parallel()
		ops := newFakeOps(gateway.Output{State: agentd.StateRunning, Chunks: []agentd.Chunk{chunk(1, "hi")}, NextCursor: 1})
		c, served := serve(t, ops, gateway.Org{}, terminal.Attach{CommandID: 5, Watch: true})
		if m := next(t, c); m.Type != "attached" || !m.ReadOnly {
			t.Fatalf("first frame %+v, want read-only", m)
		}
		send(t, c, websocket.MessageText, terminal.ClientMessage{Type: "input", Data: "rm -rf /\r"})
		if m := next(t, c); m.Type != "output" || string(m.Data) != "hi" {
			t.Fatalf("frame %+v", m)
		}
		_ = c.Close(websocket.StatusNormalClosure, "")
		if err := <-served; err != nil {
			t.Fatal(err)
		}
		if calls := ops.recorded(); !slices.Equal(calls, []string{"watch 5"}) {
			t.Fatalf("operations %q, want only the watch", calls)
		}
	})
	t.Run("no command named", func(t *testing.T) {
		t.Parallel()
		c, served := serve(t, newFakeOps(), gateway.Org{}, terminal.Attach{Watch: true})
		if m := next(t, c); m.Type != "error" || !strings.Contains(m.Message, "Say which command to watch.") {
			t.Fatalf("frame %+v", m)
		}
		if m := next(t, c); m.Type != "closed" || !strings.HasPrefix(m.Message, "1008 ") {
			t.Fatalf("after the error: %+v, want a policy-violation close", m)
		}
		var ve *apperr.ValidationError
		if err := <-served; !errors.As(err, &ve) {
			t.Fatalf("Serve: %v", err)
		}
	})
}

// TestBridgeEndsOnRefusal: a refusal met inside an open terminal closes
// it saying access was removed (a not-found too: the terminal was open),
// the detach giving the same reason; a refusal to open says its own
// message; an internal error's detail is never sent.
func TestBridgeEndsOnRefusal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		op     string
		err    error
		attach terminal.Attach
		want   string
	}{
		{"a keystroke refused", "stdin", apperr.New(apperr.ErrForbidden, "policy_denied", "A rule forbids it."), terminal.Attach{CommandID: 3},
			"Your access to this terminal was removed. A rule forbids it."},
		{"a poll finds nothing", "poll", apperr.New(apperr.ErrNotFound, "not_found", "Nothing here."), terminal.Attach{CommandID: 3},
			"Your access to this terminal was removed."},
		{"opening refused", "continue", apperr.New(apperr.ErrNotFound, "not_found", "No such session."), terminal.Attach{CommandID: 3},
			"No such session."},
		{"an internal failure", "exec", errors.New("pq: connection reset with secrets"), terminal.Attach{},
			"The terminal could not continue."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ops := newFakeOps()
			ops.refuse[tc.op] = tc.err
			c, served := serve(t, ops, gateway.Org{}, tc.attach)
			m := next(t, c)
			if m.Type == "attached" {
				send(t, c, websocket.MessageText, terminal.ClientMessage{Type: "input", Data: "x"})
				m = next(t, c)
			}
			if m.Type != "error" || m.Message != tc.want {
				t.Fatalf("frame %+v, want the error %q", m, tc.want)
			}
			_ = c.CloseNow()
			err := <-served
			if tc.op != "stdin" && err == nil {
				// A refused keystroke ends the terminal from its reader;
				// the rest end Serve with the refusal.
				t.Fatal("Serve ended without the error")
			}
			if tc.op == "stdin" || tc.op == "poll" {
				if why := <-ops.detach; why != "the terminal was ended: "+tc.want {
					t.Fatalf("detach reason %q", why)
				}
			}
		})
	}
}

// TestBridgeEndsOnRevocation: the org's revocation (or the credential's,
// found by Recheck) ends an open terminal at once with its cause.
func TestBridgeEndsOnRevocation(t *testing.T) {
	t.Parallel()
	t.Run("the org", func(t *testing.T) {
		t.Parallel()
		revoked, revoke := context.WithCancelCause(context.Background())
		ops := newFakeOps()
		c, served := serve(t, ops, gateway.Org{Revoked: revoked}, terminal.Attach{CommandID: 3})
		if m := next(t, c); m.Type != "attached" {
			t.Fatalf("frame %+v", m)
		}
		revoke(apperr.New(apperr.ErrForbidden, "org_suspended", "The organization was suspended."))
		if m := next(t, c); m.Type != "error" || m.Message != "The organization was suspended." {
			t.Fatalf("frame %+v", m)
		}
		if err := <-served; err == nil {
			t.Fatal("Serve ended without the revocation")
		}
	})
	t.Run("the credential", func(t *testing.T) {
		t.Parallel()
		ops := newFakeOps()
		var signedOut sync.Mutex
		out := false
		recheck := func(context.Context) (*authz.Actor, error) {
			signedOut.Lock()
			defer signedOut.Unlock()
			if out {
				return nil, apperr.New(apperr.ErrUnauthorized, "signed_out", "You signed out.")
			}
			return authz.System("test"), nil
		}
		c, served := serve(t, ops, gateway.Org{}, terminal.Attach{CommandID: 3, Recheck: recheck})
		if m := next(t, c); m.Type != "attached" {
			t.Fatalf("frame %+v", m)
		}
		signedOut.Lock()
		out = true
		signedOut.Unlock()
		send(t, c, websocket.MessageText, terminal.ClientMessage{Type: "input", Data: "x"})
		if m := next(t, c); m.Type != "error" || m.Message != "You signed out." {
			t.Fatalf("frame %+v", m)
		}
		<-served
		if calls := ops.recorded(); slices.Contains(calls, `stdin 3 "x"`) {
			t.Fatal("a keystroke was forwarded after the credential was revoked")
		}
	})
}

// TestDropAll: dropping the open terminals closes their connections
// abruptly; the bridge sees the connection lost.
func TestDropAll(t *testing.T) {
	t.Parallel()
	ops := newFakeOps()
	b := &terminal.Bridge{Gateway: ops}
	served := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _ := websocket.Accept(w, r, nil)
		served <- b.Serve(r.Context(), conn, gateway.Org{}, authz.System("test"), gateway.Meta{}, terminal.Attach{CommandID: 1})
	}))
	defer srv.Close()
	c, _, err := websocket.Dial(context.Background(), strings.Replace(srv.URL, "http://", "ws://", 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if m := next(t, c); m.Type != "attached" {
		t.Fatalf("frame %+v", m)
	}
	if n := b.Open.DropAll(); n != 1 {
		t.Fatalf("dropped %d terminals, want 1", n)
	}
	if why := <-ops.detach; why != "the connection was lost" {
		t.Fatalf("detach reason %q", why)
	}
	<-served
}
