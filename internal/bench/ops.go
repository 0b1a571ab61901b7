package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/gateway"
)

// output is an output answer of either path, in the gateway's shape.
type output = gateway.Output

func fromAgentd(r *agentd.SessionResponse) output {
	return output{State: r.State, ExitCode: r.ExitCode, Chunks: r.Chunks, NextCursor: r.NextCursor, More: r.More, DroppedBytes: r.DroppedBytes}
}

// Path is one way of reaching the command: agentd itself, or the gateway.
type Path interface {
	Name() string
	// Exec starts command; with wait it returns once it ended (or wait
	// passed).
	Exec(ctx context.Context, req agentd.CreateSessionRequest) (id string, out output, err error)
	Poll(ctx context.Context, id string, cursor uint64, wait time.Duration) (output, error)
	Stdin(ctx context.Context, id string, data []byte) error
	Kill(ctx context.Context, id string) error
}

// DirectPath talks to agentd.
type DirectPath struct{ C *agentd.Client }

// Name implements Path.
func (DirectPath) Name() string { return "direct" }

// Exec implements Path.
func (d DirectPath) Exec(ctx context.Context, req agentd.CreateSessionRequest) (string, output, error) {
	r, err := d.C.CreateSession(ctx, req)
	if err != nil {
		return "", output{}, err
	}
	return r.SessionID, fromAgentd(r), nil
}

// Poll implements Path.
func (d DirectPath) Poll(ctx context.Context, id string, cursor uint64, wait time.Duration) (output, error) {
	r, err := d.C.Poll(ctx, id, cursor, wait)
	if err != nil {
		return output{}, err
	}
	return fromAgentd(r), nil
}

// Stdin implements Path.
func (d DirectPath) Stdin(ctx context.Context, id string, data []byte) error {
	return d.C.WriteStdin(ctx, id, data, false)
}

// Kill implements Path.
func (d DirectPath) Kill(ctx context.Context, id string) error {
	_, err := d.C.Kill(ctx, id)
	return err
}

// GatewayPath talks to the console's terminal API with the member's key.
type GatewayPath struct {
	S *Stack
	// As is the runtime the requests are made as (nil: the stack's
	// member, in its session).
	As *Runtime
}

func (g GatewayPath) runtime() Runtime {
	if g.As != nil {
		return *g.As
	}
	return g.S.Runtime
}

func (g GatewayPath) path(format string, args ...any) string {
	return g.S.sessionPathOf(g.runtime().Session, format, args...)
}

// Name implements Path.
func (GatewayPath) Name() string { return "gateway" }

// Exec implements Path.
func (g GatewayPath) Exec(ctx context.Context, req agentd.CreateSessionRequest) (string, output, error) {
	var out output
	err := g.S.call(ctx, http.MethodPost, g.path("/commands"), g.runtime().Key, map[string]any{"command": req.Command, "tty": req.TTY,
		"stdin": req.Stdin, "wait_ms": req.WaitMS}, &out)
	return strconv.FormatInt(out.CommandID, 10), out, err
}

// Poll implements Path.
func (g GatewayPath) Poll(ctx context.Context, id string, cursor uint64, wait time.Duration) (output, error) {
	q := url.Values{"cursor": {strconv.FormatUint(cursor, 10)}, "wait_ms": {strconv.FormatInt(wait.Milliseconds(), 10)}}
	return g.S.pollChunks(ctx, g.path("/commands/%s/output?%s", id, q.Encode()), g.runtime().Key)
}

// Stdin implements Path.
func (g GatewayPath) Stdin(ctx context.Context, id string, data []byte) error {
	return g.S.call(ctx, http.MethodPost, g.path("/commands/%s/stdin", id), g.runtime().Key, map[string]any{"data": data}, nil)
}

// Kill implements Path.
func (g GatewayPath) Kill(ctx context.Context, id string) error {
	return g.S.call(ctx, http.MethodDelete, g.path("/commands/%s", id), g.runtime().Key, nil, nil)
}

// ExecGateway runs `true` through the gateway until it exits.
func (s *Stack) ExecGateway(ctx context.Context) (time.Duration, error) {
	return ExecTrue(ctx, GatewayPath{S: s})
}

// ExecTrue runs `true` through p, waiting for its exit, and returns how
// long that took.
func ExecTrue(ctx context.Context, p Path) (time.Duration, error) {
	start := time.Now()
	_, out, err := p.Exec(ctx, agentd.CreateSessionRequest{Command: "true", WaitMS: 10000})
	d := time.Since(start)
	if err != nil {
		return d, fmt.Errorf("%s exec: %w", p.Name(), err)
	}
	if out.State != agentd.StateExited || out.ExitCode == nil || *out.ExitCode != 0 {
		return d, fmt.Errorf("%s exec: %w (state %s)", p.Name(), errNotExited, out.State)
	}
	return d, nil
}

// Typist drives `cat` on a PTY through p: each keystroke is one byte on
// stdin, and it returns once the terminal's echo of it was read by a
// long-poll.
type Typist struct {
	p      Path
	id     string
	cursor uint64
	// got and want count the output bytes read and expected: a
	// keystroke echoes one byte; a newline echoes "\r\n" and cat then
	// writes the line back with "\r\n".
	got, want int
	line      int
}

// NewTypist starts `cat` on a terminal through p.
func NewTypist(ctx context.Context, p Path) (*Typist, error) {
	id, _, err := p.Exec(ctx, agentd.CreateSessionRequest{Command: "cat", TTY: true, Rows: 24, Cols: 80})
	if err != nil {
		return nil, fmt.Errorf("%s: start cat: %w", p.Name(), err)
	}
	return &Typist{p: p, id: id}, nil
}

// Key types one character and waits for its echo; it returns the round
// trip. Every 200 characters the line is ended (outside the timing) so
// the terminal's line buffer never fills.
func (t *Typist) Key(ctx context.Context) (time.Duration, error) {
	if t.line >= 200 {
		t.want += 2 + t.line + 2
		t.line = 0
		if err := t.p.Stdin(ctx, t.id, []byte("\n")); err != nil {
			return 0, err
		}
		if err := t.read(ctx); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	t.want++
	t.line++
	if err := t.p.Stdin(ctx, t.id, []byte("k")); err != nil {
		return 0, fmt.Errorf("%s stdin: %w", t.p.Name(), err)
	}
	if err := t.read(ctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func (t *Typist) read(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for t.got < t.want {
		out, err := t.p.Poll(ctx, t.id, t.cursor, 5*time.Second)
		if err != nil {
			return fmt.Errorf("%s poll: %w", t.p.Name(), err)
		}
		for _, ch := range out.Chunks {
			t.got += len(ch.Data)
		}
		t.cursor = max(t.cursor, out.NextCursor)
		if out.State != agentd.StateRunning {
			return fmt.Errorf("%s: cat ended (%s)", t.p.Name(), out.State)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no echo after 10 s (%d of %d bytes)", t.p.Name(), t.got, t.want)
		}
	}
	return nil
}

// Close ends cat.
func (t *Typist) Close(ctx context.Context) error { return t.p.Kill(ctx, t.id) }

// Throughput is one output run as the client saw it.
type Throughput struct {
	Bytes   int64
	Dropped uint64
	Elapsed time.Duration
	// ID is the command's id on its path.
	ID string
}

// MBps is the client's read rate in MiB/s.
func (t Throughput) MBps() float64 {
	return float64(t.Bytes) / (1 << 20) / t.Elapsed.Seconds()
}

// ReadAll runs command through p and reads its output by long-polls until
// it ends, counting bytes.
func ReadAll(ctx context.Context, p Path, command string) (Throughput, error) {
	start := time.Now()
	id, out, err := p.Exec(ctx, agentd.CreateSessionRequest{Command: command})
	if err != nil {
		return Throughput{}, fmt.Errorf("%s exec: %w", p.Name(), err)
	}
	res := Throughput{ID: id}
	for {
		for _, ch := range out.Chunks {
			res.Bytes += int64(len(ch.Data))
		}
		res.Dropped = max(res.Dropped, out.DroppedBytes)
		if out.State != agentd.StateRunning && !out.More {
			break
		}
		cursor := out.NextCursor
		if out, err = p.Poll(ctx, id, cursor, 5*time.Second); err != nil {
			return res, fmt.Errorf("%s poll: %w", p.Name(), err)
		}
	}
	res.Elapsed = time.Since(start)
	if out.ExitCode == nil || *out.ExitCode != 0 {
		return res, fmt.Errorf("%s: %q ended %s", p.Name(), command, out.State)
	}
	return res, nil
}
