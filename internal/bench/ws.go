package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/terminal"
)

// WSPath is the browser terminal's WebSocket, as xterm.js uses it: the
// command starts through the JSON API (so both paths type into the same
// kind of command), then a socket attaches to it with the member's API key
// (a non-browser client: no cookie, so no Origin or CSRF token); each
// keystroke is one input message and output arrives as output messages.
// One WSPath drives one command.
type WSPath struct {
	S    *Stack
	conn *websocket.Conn
}

// Name implements Path.
func (*WSPath) Name() string { return "websocket" }

// Exec implements Path: it starts the command and attaches the socket.
func (w *WSPath) Exec(ctx context.Context, req agentd.CreateSessionRequest) (string, output, error) {
	id, out, err := GatewayPath{S: w.S}.Exec(ctx, req)
	if err != nil {
		return id, out, err
	}
	u := "ws" + strings.TrimPrefix(w.S.URL, "http") + fmt.Sprintf("/o/%s/sessions/%d/terminal?command=%s&cursor=0", w.S.Org, w.S.Session, id)
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{"gatehouse.v1"},
		HTTPHeader: http.Header{"Authorization": {"Bearer " + w.S.Key}}})
	if err != nil {
		return id, out, fmt.Errorf("websocket: dial: %w", err)
	}
	var m terminal.ServerMessage
	if err := wsjson.Read(ctx, conn, &m); err != nil || m.Type != "attached" {
		conn.CloseNow()
		return id, out, fmt.Errorf("websocket: attach: %v (%s %s)", err, m.Type, m.Message)
	}
	w.conn = conn
	return id, out, nil
}

// Poll implements Path: it waits up to wait for the next message.
func (w *WSPath) Poll(ctx context.Context, _ string, cursor uint64, wait time.Duration) (output, error) {
	out := output{State: agentd.StateRunning, NextCursor: cursor}
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var m terminal.ServerMessage
	if err := wsjson.Read(rctx, w.conn, &m); err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return out, nil // nothing within wait, as a long-poll answers
		}
		return out, fmt.Errorf("websocket: read: %w", err)
	}
	switch m.Type {
	case "output":
		out.Chunks = []agentd.Chunk{{ID: m.ID, Stream: m.Stream, Data: m.Data}}
		out.NextCursor = max(cursor, m.ID)
	case "exit":
		out.State, out.ExitCode = m.State, m.ExitCode
	case "error":
		return out, fmt.Errorf("websocket: %s", m.Message)
	}
	return out, nil
}

// Stdin implements Path.
func (w *WSPath) Stdin(ctx context.Context, _ string, data []byte) error {
	b, err := json.Marshal(terminal.ClientMessage{Type: "input", Data: string(data)})
	if err != nil {
		return err
	}
	if err := w.conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("websocket: send: %w", err)
	}
	return nil
}

// Kill implements Path: it closes the socket and ends the command.
func (w *WSPath) Kill(ctx context.Context, id string) error {
	if w.conn != nil {
		w.conn.Close(websocket.StatusNormalClosure, "")
	}
	return GatewayPath{S: w.S}.Kill(ctx, id)
}
