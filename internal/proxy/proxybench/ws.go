package proxybench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/proxy"
)

// WSTypist drives `cat` on a PTY through the browser terminal's WebSocket,
// as xterm.js does: each keystroke is one input message, and it returns
// once the output messages carried its echo. The command is started with
// the JSON API and the socket attaches to it, so both typists type into
// the same kind of command through the same gateway operations.
type WSTypist struct {
	conn *websocket.Conn
	s    *Stack
	id   string
	// got and want count output bytes, as Typist does.
	got, want int
	line      int
}

// NewWSTypist starts `cat` on a terminal and opens the browser terminal's
// WebSocket on it with the member's API key (a non-browser client: no
// cookie, so no Origin or CSRF token).
func NewWSTypist(ctx context.Context, s *Stack) (*WSTypist, error) {
	id, _, err := GatewayPath{S: s}.Exec(ctx, agentd.CreateSessionRequest{Command: "cat", TTY: true, Rows: 24, Cols: 80})
	if err != nil {
		return nil, fmt.Errorf("websocket: start cat: %w", err)
	}
	u := "ws" + strings.TrimPrefix(s.URL, "http") + fmt.Sprintf("/o/%s/sessions/%d/terminal?command=%s&cursor=0", s.Org, s.Session, id)
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{"gatehouse.v1"},
		HTTPHeader: http.Header{"Authorization": {"Bearer " + s.Key}}})
	if err != nil {
		return nil, fmt.Errorf("websocket: dial: %w", err)
	}
	t := &WSTypist{conn: conn, s: s, id: id}
	var m proxy.ServerMessage
	if err := wsjson.Read(ctx, conn, &m); err != nil || m.Type != "attached" {
		conn.CloseNow()
		return nil, fmt.Errorf("websocket: attach: %v (%s %s)", err, m.Type, m.Message)
	}
	return t, nil
}

// Key types one character and waits for its echo; it returns the round
// trip. Every 200 characters the line is ended outside the timing.
func (t *WSTypist) Key(ctx context.Context) (time.Duration, error) {
	if t.line >= 200 {
		t.want += 2 + t.line + 2
		t.line = 0
		if err := t.send(ctx, "\n"); err != nil {
			return 0, err
		}
		if err := t.read(ctx); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	t.want++
	t.line++
	if err := t.send(ctx, "k"); err != nil {
		return 0, err
	}
	if err := t.read(ctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func (t *WSTypist) send(ctx context.Context, data string) error {
	b, err := json.Marshal(proxy.ClientMessage{Type: "input", Data: data})
	if err != nil {
		return err
	}
	if err := t.conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("websocket: send: %w", err)
	}
	return nil
}

func (t *WSTypist) read(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for t.got < t.want {
		var m proxy.ServerMessage
		if err := wsjson.Read(rctx, t.conn, &m); err != nil {
			return fmt.Errorf("websocket: no echo (%d of %d bytes): %w", t.got, t.want, err)
		}
		switch m.Type {
		case "output":
			t.got += len(m.Data)
		case "exit", "error":
			return fmt.Errorf("websocket: cat ended: %s %s", m.State, m.Message)
		}
	}
	return nil
}

// Close closes the socket and ends cat.
func (t *WSTypist) Close(ctx context.Context) error {
	t.conn.Close(websocket.StatusNormalClosure, "")
	return GatewayPath{S: t.s}.Kill(ctx, t.id)
}
