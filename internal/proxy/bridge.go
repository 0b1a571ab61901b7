package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/recordings"
)

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
	Message  string `json:"message,omitempty"`
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
	// keystroke, window change and poll, and every RecheckEvery while the
	// terminal is idle; its error (signed out, access removed) closes the
	// terminal with its message. Nil keeps the handshake's actor.
	Recheck func(ctx context.Context) (*authz.Actor, error)
}

// RecheckEvery is how often an idle terminal or a waiting long-poll
// checks its credential again: a revocation reaches it within this.
const RecheckEvery = time.Second

// WatchPrincipal returns ctx ended, with recheck's error as its cause, as
// soon as recheck fails; it checks every RecheckEvery. A nil recheck never
// ends it. Call stop when done.
func WatchPrincipal(ctx context.Context, recheck func(context.Context) (*authz.Actor, error)) (watched context.Context, stop func()) {
	watched, cancel := context.WithCancelCause(ctx)
	if recheck == nil {
		return watched, func() { cancel(context.Canceled) }
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(RecheckEvery)
		defer t.Stop()
		for {
			select {
			case <-watched.Done():
				return
			case <-t.C:
				_, err := recheck(watched)
				if revocation(err) && watched.Err() == nil {
					cancel(err)
					return
				}
				// Anything else (the database away for a moment) is not
				// a revocation: check again on the next tick.
			}
		}
	}()
	// stop waits for the watcher: its recheck reads the request it was
	// made for, which must not be used once the request is over.
	return watched, func() {
		cancel(context.Canceled)
		<-exited
	}
}

// revocation reports an error that says the credential or the access no
// longer stands.
func revocation(err error) bool {
	return errors.Is(err, apperr.ErrUnauthorized) || errors.Is(err, apperr.ErrForbidden) || errors.Is(err, apperr.ErrNotFound)
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

// endedBy is the error that ended ctx when it was a revocation or another
// failure to report (not a plain cancel); nil otherwise.
func endedBy(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	cause := context.Cause(ctx)
	if errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded) {
		return nil
	}
	return cause
}

// shellCommand starts the user's login shell, or sh where bash is missing.
const shellCommand = `if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi`

// Terminals tracks open browser terminals, so they can be closed (an org
// suspended, a test dropping connections).
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

// DropAll closes every open terminal connection abruptly; clients
// reconnect and continue from their cursor.
func (t *Terminals) DropAll() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.conns)
	for c := range t.conns {
		_ = c.CloseNow()
	}
	return n
}

// idlePollPause spaces the bridge's polls that come back at once with
// nothing, so they do not spin.
const idlePollPause = 250 * time.Millisecond

// Bridge serves one browser terminal over conn until either side ends it.
func (g *Gateway) Bridge(ctx context.Context, conn *websocket.Conn, org Org, a *authz.Actor, m Meta, at Attach) error {
	g.Terminals.add(conn)
	defer g.Terminals.remove(conn)
	// Reads use the request's own context: a read canceled by a revocation
	// would close the connection before the message saying why is sent.
	readCtx := ctx
	ctx, cancel := bindRevoked(ctx, org.Revoked)
	defer cancel()
	// The credential is checked again while the terminal is open, typed
	// into or not: a revocation closes it within RecheckEvery.
	ctx, stopWatch := WatchPrincipal(ctx, at.Recheck)
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
			return durable(ferr)
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
		_ = send(ServerMessage{Type: "error", Message: msg})
		_ = conn.Close(websocket.StatusPolicyViolation, truncate(msg, 120))
		return err
	}

	cid, cursor := at.CommandID, at.Cursor
	if at.Watch {
		if cid == 0 {
			return fail(&apperr.ValidationError{Fields: map[string]string{"command": "Say which command to watch."}})
		}
		// The read the watch page made, and the one Poll makes: a command
		// of a closed session is replayed from its recording, then ends.
		t, _, err := resolveRecorded(ctx, org, a, at.SessionID)
		if err != nil {
			return fail(err)
		}
		c, err := recordings.GetInSession(ctx, org.DB, at.SessionID, cid)
		if err != nil {
			return fail(err)
		}
		if _, err := org.Audit.Append(ctx, event(a, m, "command.watch", c.Target(), map[string]any{"session_id": t.Session.ID})); err != nil {
			return fail(durable(err))
		}
	} else if cid == 0 {
		out, err := g.Exec(ctx, org, a, m, at.SessionID, ExecRequest{Command: shellCommand, TTY: true, Stdin: true, Rows: at.Rows, Cols: at.Cols})
		if err != nil {
			return fail(err)
		}
		cid = out.CommandID
	} else {
		// Continuing a command is using the session: authorized before
		// anything, even whether the command exists, is said (running's
		// lookup). A command that ended meanwhile is not refused: the
		// reconnecting terminal gets the output it missed and the end.
		if _, _, err := g.sessionCommand(ctx, org, a, at.SessionID, cid, ActStdin); err != nil {
			return fail(err)
		}
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
				err = done(act, g.Stdin(ctx, org, act, at.SessionID, cid, []byte(msg.Data), false))
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
		if out.NextCursor > cursor && len(out.Chunks) == 0 {
			cursor = out.NextCursor
		}
		if out.State != recordings.StateRunning && !out.More {
			if err := send(ServerMessage{Type: "exit", State: out.State, ExitCode: out.ExitCode}); err != nil {
				return err
			}
			return conn.Close(websocket.StatusNormalClosure, "the command ended")
		}
		if len(out.Chunks) == 0 && time.Since(asked) < idlePollPause {
			// Answered at once with nothing (a command of a closed session
			// whose end is not recorded yet): no wait at agentd paced it.
			select {
			case <-ctx.Done():
			case <-time.After(idlePollPause):
			}
		}
	}
	if cause := endedBy(ctx); cause != nil {
		// Revoked (signed out, access removed, org suspended): say why.
		return fail(cause)
	}
	_ = conn.Close(websocket.StatusGoingAway, "the terminal was closed")
	return nil
}
