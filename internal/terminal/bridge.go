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

// Operations are the terminal gateway's operations a bridge forwards, each
// checked, recorded and audited by the gateway; *gateway.Gateway has them.
type Operations interface {
	Exec(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID int64, req gateway.ExecRequest) (gateway.Output, error)
	OpenedTerminal(org gateway.Org, a *authz.Actor, commandID int64)
	Watch(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID, commandID int64) error
	Continue(ctx context.Context, org gateway.Org, a *authz.Actor, sessionID, commandID int64) error
	Attach(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID, commandID int64) error
	Detach(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID, commandID int64, reason string, ended bool) error
	Stdin(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID, commandID int64, data []byte, eof bool) error
	Resize(ctx context.Context, org gateway.Org, a *authz.Actor, m gateway.Meta, sessionID, commandID int64, rows, cols uint16) error
	Poll(ctx context.Context, org gateway.Org, a *authz.Actor, sessionID, commandID int64, cursor uint64, waitMS int64) (gateway.Output, error)
	// EndReason says what ended a command beyond its state:
	// "session_close" when its session's close did, else "".
	EndReason(ctx context.Context, org gateway.Org, sessionID, commandID int64) string
}

// Bridge serves browser terminals through a gateway. One per process.
type Bridge struct {
	Gateway Operations
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

// Serve serves one browser terminal over conn until either side ends it:
// a reader forwards keystrokes and window changes, a poller sends the
// command's output and end, both through one writer.
func (b *Bridge) Serve(ctx context.Context, conn *websocket.Conn, org gateway.Org, a *authz.Actor, m gateway.Meta, at Attach) error {
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
	t := &term{ops: b.Gateway, org: org, a: a, m: m, at: at, ctx: ctx, w: &writer{conn: conn, ctx: ctx}, cursor: at.Cursor}
	if err := t.open(); err != nil {
		return t.w.fail(err)
	}
	if !at.Watch {
		defer t.detach(b.logger())
	}
	if err := t.done(a, nil); err != nil {
		return t.w.fail(err)
	}
	if err := t.w.send(ServerMessage{Type: "attached", CommandID: t.cid, ReadOnly: at.Watch}); err != nil {
		return err
	}
	// The bridge returns only once the reader did: it acts for the
	// request, which must not be used once the request is over.
	reading := make(chan struct{})
	defer func() { <-reading }()
	defer conn.CloseNow()
	go func() {
		defer close(reading)
		defer cancel()
		(&reader{t: t, conn: conn}).run(readCtx)
	}()
	return (&poller{t: t}).run()
}

// term is one browser terminal being served: what it acts on, as whom,
// and the command it shows.
type term struct {
	ops Operations
	org gateway.Org
	a   *authz.Actor
	m   gateway.Meta
	at  Attach
	// ctx ends when the terminal must: revoked, or either side gone.
	ctx context.Context
	w   *writer
	// cid is the command shown; cursor the last chunk sent of it.
	cid    int64
	cursor uint64
	// ended says the command's end was seen and sent (the poller's).
	ended bool
}

// actor is the actor of one operation: the credential checked again, with
// its roles as they stand.
func (t *term) actor() (*authz.Actor, error) {
	if t.at.Recheck == nil {
		return t.a, nil
	}
	return t.at.Recheck(t.ctx)
}

// done writes an operation's refusals to the audit log at once, not when
// the connection ends (a crash would lose them), and returns err.
func (t *term) done(act *authz.Actor, err error) error {
	if ferr := act.Flush(context.WithoutCancel(t.ctx)); ferr != nil {
		return gateway.Unrecorded(ferr)
	}
	return err
}

// open starts, continues or watches the command the terminal shows, each
// authorized and audited before anything is shown or sent.
func (t *term) open() error {
	g, at := t.ops, t.at
	t.cid = at.CommandID
	switch {
	case at.Watch:
		if t.cid == 0 {
			return &apperr.ValidationError{Fields: map[string]string{"command": "Say which command to watch."}}
		}
		return g.Watch(t.ctx, t.org, t.a, t.m, at.SessionID, t.cid)
	case t.cid == 0:
		out, err := g.Exec(t.ctx, t.org, t.a, t.m, at.SessionID, gateway.ExecRequest{Command: ShellCommand, TTY: true, Stdin: true, Rows: at.Rows, Cols: at.Cols}.Interactive())
		if err != nil {
			return err
		}
		t.cid = out.CommandID
		g.OpenedTerminal(t.org, t.a, t.cid)
		return nil
	}
	// Continuing a command is using the session: authorized before
	// anything, even whether the command exists, is said. A command that
	// ended meanwhile is not refused: the reconnecting terminal gets the
	// output it missed and the end.
	if err := g.Continue(t.ctx, t.org, t.a, at.SessionID, t.cid); err != nil {
		return err
	}
	// Joining a running command, one's own after a reload or someone
	// else's, is audited before anything is shown or sent.
	return g.Attach(t.ctx, t.org, t.a, t.m, at.SessionID, t.cid)
}

// detach audits a terminal leaving its command: command.detach with why
// (closed, lost, access removed), or nothing more once its end was seen
// (its command.end says all).
func (t *term) detach(log *slog.Logger) {
	t.w.leave("the terminal was closed")
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.ctx), 10*time.Second)
	defer cancel()
	if err := t.ops.Detach(ctx, t.org, t.a, t.m, t.at.SessionID, t.cid, t.w.why(), t.ended); err != nil {
		log.Warn("recording a terminal's detach failed", "org", t.org.Slug, "command", t.cid, "error", err)
	}
}

// writer sends the console's messages over a terminal's connection and
// keeps why the terminal ends, the first reason given winning (the reader
// and the poller may both end it).
type writer struct {
	conn *websocket.Conn
	// ctx is the terminal's: a message is sent after it ended too.
	ctx     context.Context
	mu      sync.Mutex
	leaving string
}

// send writes one message. It is not bound to the terminal's context: the
// message that says why the terminal ends must still go out once that
// ended.
func (w *writer) send(msg ServerMessage) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), 10*time.Second)
	defer cancel()
	return w.conn.Write(ctx, websocket.MessageText, b)
}

// leave records why the terminal ends, unless a reason was given first.
func (w *writer) leave(why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.leaving == "" {
		w.leaving = why
	}
}

func (w *writer) why() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.leaving
}

// fail ends the terminal with err: its message (an apperr's own, never an
// internal detail) is sent, then the connection closes. It returns err.
func (w *writer) fail(err error) error {
	msg := "The terminal could not continue."
	var ae *apperr.Error
	var ve *apperr.ValidationError
	switch {
	case errors.As(err, &ae):
		msg = ae.Message
	case errors.As(err, &ve):
		msg = ve.Error()
	}
	// Said before the connection closes: the reader then sees it closed,
	// which is not why.
	w.leave("the terminal was ended: " + msg)
	_ = w.send(ServerMessage{Type: "error", Message: msg})
	_ = w.conn.Close(websocket.StatusPolicyViolation, clip.String(msg, 120))
	return err
}

// reader forwards a terminal's keystrokes and window changes, in order,
// through the gateway, each checked against the credential and the
// policy as they stand; a watching terminal's go nowhere.
type reader struct {
	t    *term
	conn *websocket.Conn
}

// run reads until the connection ends or an operation is refused (which
// ends the terminal).
func (r *reader) run(ctx context.Context) {
	t := r.t
	for {
		typ, b, err := r.conn.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) == -1 && ctx.Err() == nil {
				t.w.leave("the connection was lost")
			}
			return
		}
		if t.at.Watch || typ != websocket.MessageText {
			continue
		}
		var msg ClientMessage
		if json.Unmarshal(b, &msg) != nil || !msg.valid() {
			continue
		}
		if err := r.forward(msg); err != nil {
			_ = t.w.fail(err)
			return
		}
	}
}

// valid reports a message worth forwarding: input with data, or a window
// size within bounds.
func (m ClientMessage) valid() bool {
	switch m.Type {
	case "input":
		return m.Data != ""
	case "resize":
		return m.Rows > 0 && m.Cols > 0 && m.Rows <= 4096 && m.Cols <= 4096
	}
	return false
}

// forward sends one keystroke or window change through the gateway as
// the actor the credential is now.
func (r *reader) forward(msg ClientMessage) error {
	t := r.t
	act, err := t.actor()
	if err != nil {
		return err
	}
	switch msg.Type {
	case "input":
		err = t.done(act, t.ops.Stdin(t.ctx, t.org, act, t.m, t.at.SessionID, t.cid, []byte(msg.Data), false))
	case "resize":
		// A window change of a command that ended is no refusal.
		if err = t.done(act, t.ops.Resize(t.ctx, t.org, act, t.m, t.at.SessionID, t.cid, msg.Rows, msg.Cols)); errors.Is(err, apperr.ErrConflict) {
			err = nil
		}
	}
	if err != nil {
		return lostAccess(err)
	}
	return nil
}

// poller sends a terminal's command's output from its cursor, and its
// end, long-polling the gateway.
type poller struct {
	t *term
}

// run polls until the command ends (sent with its end), the terminal's
// context ends (said why, if revoked) or a poll is refused.
func (p *poller) run() error {
	t := p.t
	for t.ctx.Err() == nil {
		asked := time.Now()
		act, err := t.actor()
		if err != nil {
			return t.w.fail(err)
		}
		out, err := t.ops.Poll(t.ctx, t.org, act, t.at.SessionID, t.cid, t.cursor, 20000)
		if err = t.done(act, err); err != nil {
			if t.ctx.Err() != nil {
				break
			}
			return t.w.fail(lostAccess(err))
		}
		advanced, err := p.send(out)
		if err != nil {
			return err
		}
		if out.State != recordings.StateRunning && !out.More {
			t.ended = true
			t.w.leave("the command ended")
			if err := t.w.send(ServerMessage{Type: "exit", State: out.State, ExitCode: out.ExitCode, EndedBy: t.ops.EndReason(t.ctx, t.org, t.at.SessionID, t.cid)}); err != nil {
				return err
			}
			return t.w.conn.Close(websocket.StatusNormalClosure, "the command ended")
		}
		if !advanced && time.Since(asked) < idlePollPause {
			// Answered at once with nothing (a command of a closed session
			// whose end is not recorded yet): no wait at agentd paced it.
			select {
			case <-t.ctx.Done():
			case <-time.After(idlePollPause):
			}
		}
	}
	if cause := gateway.EndedBy(t.ctx); cause != nil {
		// Revoked (signed out, access removed, org suspended): say why.
		return t.w.fail(cause)
	}
	_ = t.w.conn.Close(websocket.StatusGoingAway, "the terminal was closed")
	return nil
}

// send sends the chunks of out after the cursor, moving it, and reports
// whether the answer moved it at all: exec records are not sent but pass
// the cursor, so an answer that held only them moved it.
func (p *poller) send(out gateway.Output) (advanced bool, err error) {
	t := p.t
	for _, ch := range out.Chunks {
		if ch.ID <= t.cursor {
			continue
		}
		if err := t.w.send(ServerMessage{Type: "output", ID: ch.ID, Stream: ch.Stream, Data: ch.Data}); err != nil {
			return true, err
		}
		t.cursor = ch.ID
	}
	advanced = len(out.Chunks) > 0 || out.NextCursor > t.cursor
	if out.NextCursor > t.cursor && len(out.Chunks) == 0 {
		t.cursor = out.NextCursor
	}
	return advanced, nil
}
