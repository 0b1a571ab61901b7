package terminal

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/clip"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/tenant"
)

// Package terminal is the browser terminal: a WebSocket bridged to the
// terminal gateway's operations (internal/gateway), each checked, recorded and
// audited there as if it came through the JSON API. It keeps the open
// connections, so they can be dropped (tests) and closed on revocation.
//
// The browser terminal speaks JSON text messages over a WebSocket that the
// console bridges to the same operations as the JSON API: every keystroke
// is a Stdin (recorded before it is forwarded), every window change a
// Resize (audited), and output comes from Poll with a cursor. A client
// that reconnects names its command and the last chunk id it showed, and
// continues from there without losing or repeating output.

// ClientMessage is what the browser sends.
type ClientMessage struct {
	// Type is "input" (Data holds the keystrokes) or "resize".
	Type string `json:"type"`
	Data string `json:"data,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
}

// ServerMessage is what the console sends.
type ServerMessage struct {
	// Type is "attached", "output", "exit" or "error".
	Type      string `json:"type"`
	CommandID int64  `json:"command_id,omitempty"`
	ReadOnly  bool   `json:"read_only,omitempty"`
	// ID is the chunk id of output: the cursor to reconnect with.
	ID       uint64 `json:"id,omitempty"`
	Stream   string `json:"stream,omitempty"`
	Data     []byte `json:"data,omitempty"`
	State    string `json:"state,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	// EndedBy is "session_close" on the exit of a command its session's
	// close ended, so the terminal says what closing did.
	EndedBy string `json:"ended_by,omitempty"`
	Message string `json:"message,omitempty"`
}

// Attach says what a WebSocket connects to.
type Attach struct {
	SessionID int64
	// CommandID continues an existing command from Cursor; 0 starts an
	// interactive shell.
	CommandID int64
	Cursor    uint64
	// Watch opens the command read-only: keystrokes go nowhere.
	Watch      bool
	Rows, Cols uint16
	// Recheck authenticates the connection's credential again and returns
	// the actor to act as now (roles as they stand). It runs before every
	// keystroke, window change and poll, and every gateway.RecheckEvery while the
	// terminal is idle; its error (signed out, access removed) closes the
	// terminal with its message. Nil keeps the handshake's actor.
	Recheck func(ctx context.Context) (*authz.Actor, error)
}

// lostAccess words a refusal met inside an open terminal: the person's
// access changed since it opened (a role removed, a policy added), and the
// terminal closes saying so rather than "nothing at this address".
func lostAccess(err error) error {
	var ae *apperr.Error
	if !errors.Is(err, apperr.ErrForbidden) && !errors.Is(err, apperr.ErrNotFound) {
		return err
	}
	msg := "Your access to this terminal was removed."
	if errors.As(err, &ae) && ae.Code != "not_found" && ae.Message != "" {
		msg += " " + ae.Message
	}
	return apperr.New(apperr.ErrForbidden, "access_removed", "%s", msg)
}

// Terminals is the set of a bridge's open browser terminals.
type Terminals struct {
	mu    sync.Mutex
	conns map[*websocket.Conn]struct{}
}

func (t *Terminals) add(c *websocket.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conns == nil {
		t.conns = map[*websocket.Conn]struct{}{}
	}
	t.conns[c] = struct{}{}
}

func (t *Terminals) remove(c *websocket.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.conns, c)
}

// idlePollPause spaces the bridge's polls that come back at once with
// nothing, so they do not spin.
const idlePollPause = 250 * time.Millisecond

// Bridge serves browser terminals through a gateway. One per process.
type Bridge struct {
	Gateway *gateway.Gateway
	Logger  *slog.Logger
	// Open are the open browser terminals.
	Open Terminals
}

func (b *Bridge) logger() *slog.Logger {
	if b.Logger != nil {
		return b.Logger
	}
	return slog.Default()
}

// Serve serves one browser terminal over conn until either side ends it.
func (b *Bridge) Serve(ctx context.Context, conn *websocket.Conn, org gateway.Org, a *authz.Actor, m gateway.Meta, at Attach) error {
	g := b.Gateway
	b.Open.add(conn)
	defer b.Open.remove(conn)
	// Reads use the request's own context: a read canceled by a revocation
	// would close the connection before the message saying why is sent.
	readCtx := ctx
	ctx, cancel := tenant.BindRevoked(ctx, org.Revoked)
	defer cancel()
	// The credential is checked again while the terminal is open, typed
	// into or not: a revocation closes it within gateway.RecheckEvery.
	ctx, stopWatch := gateway.WatchPrincipal(ctx, at.Recheck)
	defer stopWatch()
	// now is the actor of one operation: the credential checked again,
	// with its roles as they stand.
	now := func() (*authz.Actor, error) {
		if at.Recheck == nil {
			return a, nil
		}
		return at.Recheck(ctx)
	}
	// done writes the operation's refusals to the audit log at once, not
	// when the connection ends (a crash would lose them).
	done := func(act *authz.Actor, err error) error {
		if ferr := act.Flush(context.WithoutCancel(ctx)); ferr != nil {
			return gateway.Unrecorded(ferr)
		}
		return err
	}
	send := func(msg ServerMessage) error {
		b, err := json.Marshal(msg)
		if err != nil {
			return err
		}
		// Not bound to ctx: the message that says why the terminal ends
		// must still go out once ctx ended.
		wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer wcancel()
		return conn.Write(wctx, websocket.MessageText, b)
	}
	// leaving is why the terminal ends, the first reason given winning
	// (both the reader and the poll loop may end it).
	var leaving struct {
		sync.Mutex
		why string
	}
	leave := func(why string) {
		leaving.Lock()
		defer leaving.Unlock()
		if leaving.why == "" {
			leaving.why = why
		}
	}
	fail := func(err error) error {
		msg := "The terminal could not continue."
		var ae *apperr.Error
		var ve *apperr.ValidationError
		switch {
		case errors.As(err, &ae):
			msg = ae.Message
		case errors.As(err, &ve):
			msg = ve.Error()
		}
		// Said before the connection closes: the reader then sees it
		// closed, which is not why.
		leave("the terminal was ended: " + msg)
		_ = send(ServerMessage{Type: "error", Message: msg})
		_ = conn.Close(websocket.StatusPolicyViolation, clip.String(msg, 120))
		return err
	}

	cid, cursor := at.CommandID, at.Cursor
	if at.Watch {
		if cid == 0 {
			return fail(&apperr.ValidationError{Fields: map[string]string{"command": "Say which command to watch."}})
		}
		if err := g.Watch(ctx, org, a, m, at.SessionID, cid); err != nil {
			return fail(err)
		}
	} else if cid == 0 {
		out, err := g.Exec(ctx, org, a, m, at.SessionID, gateway.ExecRequest{Command: ShellCommand, TTY: true, Stdin: true, Rows: at.Rows, Cols: at.Cols})
		if err != nil {
			return fail(err)
		}
		cid = out.CommandID
		g.OpenedTerminal(org, a, cid)
	} else {
		// Continuing a command is using the session: authorized before
		// anything, even whether the command exists, is said (running's
		// lookup). A command that ended meanwhile is not refused: the
		// reconnecting terminal gets the output it missed and the end.
		if err := g.Continue(ctx, org, a, at.SessionID, cid); err != nil {
			return fail(err)
		}
		// Joining a running command, one's own after a reload or someone
		// else's, is audited before anything is shown or sent.
		if err := g.Attach(ctx, org, a, m, at.SessionID, cid); err != nil {
			return fail(err)
		}
	}
	// ended says the command's end was seen: its command.end says all; a
	// terminal leaving a command that still runs is audited as
	// command.detach, with why (closed, lost, access removed).
	ended := false
	if !at.Watch {
		defer func() {
			leave("the terminal was closed")
			dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer dcancel()
			if err := g.Detach(dctx, org, a, m, at.SessionID, cid, leaving.why, ended); err != nil {
				b.logger().Warn("recording a terminal's detach failed", "org", org.Slug, "command", cid, "error", err)
			}
		}()
	}
	if err := done(a, nil); err != nil {
		return fail(err)
	}
	if err := send(ServerMessage{Type: "attached", CommandID: cid, ReadOnly: at.Watch}); err != nil {
		return err
	}

	// Keystrokes and window changes, in order, through the gateway. The
	// bridge returns only once this reader did: it acts for the request,
	// which must not be used once the request is over.
	reader := make(chan struct{})
	defer func() { <-reader }()
	defer conn.CloseNow()
	go func() {
		defer close(reader)
		defer cancel()
		for {
			typ, b, err := conn.Read(readCtx)
			if err != nil {
				if websocket.CloseStatus(err) == -1 && readCtx.Err() == nil {
					leave("the connection was lost")
				}
				return
			}
			if at.Watch || typ != websocket.MessageText {
				continue
			}
			var msg ClientMessage
			if json.Unmarshal(b, &msg) != nil {
				continue
			}
			if (msg.Type == "input" && msg.Data == "") || (msg.Type == "resize" && (msg.Rows == 0 || msg.Cols == 0 || msg.Rows > 4096 || msg.Cols > 4096)) {
				continue
			}
			// Every keystroke and window change is checked against the
			// credential and the policy as they stand now.
			act, err := now()
			if err != nil {
				_ = fail(err)
				return
			}
			switch msg.Type {
			case "input":
				err = done(act, g.Stdin(ctx, org, act, m, at.SessionID, cid, []byte(msg.Data), false))
			case "resize":
				if err = done(act, g.Resize(ctx, org, act, m, at.SessionID, cid, msg.Rows, msg.Cols)); errors.Is(err, apperr.ErrConflict) {
					err = nil
				}
			}
			if err != nil {
				_ = fail(lostAccess(err))
				return
			}
		}
	}()

	for ctx.Err() == nil {
		asked := time.Now()
		act, err := now()
		if err != nil {
			return fail(err)
		}
		out, err := g.Poll(ctx, org, act, at.SessionID, cid, cursor, 20000)
		if err = done(act, err); err != nil {
			if ctx.Err() != nil {
				break
			}
			return fail(lostAccess(err))
		}
		for _, ch := range out.Chunks {
			if ch.ID <= cursor {
				continue
			}
			if err := send(ServerMessage{Type: "output", ID: ch.ID, Stream: ch.Stream, Data: ch.Data}); err != nil {
				return err
			}
			cursor = ch.ID
		}
		// Exec records are not sent but pass the cursor: an answer that
		// held only them moved it.
		advanced := out.NextCursor > cursor
		if out.NextCursor > cursor && len(out.Chunks) == 0 {
			cursor = out.NextCursor
		}
		if out.State != recordings.StateRunning && !out.More {
			ended = true
			if err := send(ServerMessage{Type: "exit", State: out.State, ExitCode: out.ExitCode, EndedBy: endedBy(ctx, org, at.SessionID, cid)}); err != nil {
				return err
			}
			return conn.Close(websocket.StatusNormalClosure, "the command ended")
		}
		if len(out.Chunks) == 0 && !advanced && time.Since(asked) < idlePollPause {
			// Answered at once with nothing (a command of a closed session
			// whose end is not recorded yet): no wait at agentd paced it.
			select {
			case <-ctx.Done():
			case <-time.After(idlePollPause):
			}
		}
	}
	if cause := gateway.EndedBy(ctx); cause != nil {
		// Revoked (signed out, access removed, org suspended): say why.
		return fail(cause)
	}
	_ = conn.Close(websocket.StatusGoingAway, "the terminal was closed")
	return nil
}

// endedBy says what ended a command beyond its state: "session_close"
// when its session's close did (the close records why before it kills
// anything, so the reason is there by the time agentd reports the end).
// A failed read says nothing more rather than fail the terminal.
func endedBy(ctx context.Context, org gateway.Org, sessionID, commandID int64) string {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	c, err := recordings.GetInSession(rctx, org.DB, sessionID, commandID)
	if err == nil && recordings.EndedBySessionClose(c.Reason) {
		return "session_close"
	}
	return ""
}
