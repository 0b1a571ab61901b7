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
	ctx, cancel := bindRevoked(ctx, org.Revoked)
	defer cancel()
	send := func(msg ServerMessage) error {
		b, err := json.Marshal(msg)
		if err != nil {
			return err
		}
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
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
		c, err := commandOf(ctx, org, at.SessionID, cid)
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
	if err := send(ServerMessage{Type: "attached", CommandID: cid, ReadOnly: at.Watch}); err != nil {
		return err
	}

	// Keystrokes and window changes, in order, through the gateway.
	go func() {
		defer cancel()
		for {
			typ, b, err := conn.Read(ctx)
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
			switch msg.Type {
			case "input":
				if msg.Data == "" {
					continue
				}
				if err := g.Stdin(ctx, org, a, at.SessionID, cid, []byte(msg.Data), false); err != nil {
					_ = fail(err)
					return
				}
			case "resize":
				if msg.Rows == 0 || msg.Cols == 0 || msg.Rows > 4096 || msg.Cols > 4096 {
					continue
				}
				if err := g.Resize(ctx, org, a, m, at.SessionID, cid, msg.Rows, msg.Cols); err != nil && !errors.Is(err, apperr.ErrConflict) {
					_ = fail(err)
					return
				}
			}
		}
	}()

	for ctx.Err() == nil {
		asked := time.Now()
		out, err := g.Poll(ctx, org, a, at.SessionID, cid, cursor, 20000)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return fail(err)
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
	_ = conn.Close(websocket.StatusGoingAway, "the terminal was closed")
	return nil
}
