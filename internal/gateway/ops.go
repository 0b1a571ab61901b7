package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// Output is a command's state and a batch of its output; the fields
// mirror agentd's session response, with the gateway's command id.
type Output struct {
	CommandID    int64          `json:"command_id"`
	SessionID    int64          `json:"session_id"`
	TTY          bool           `json:"tty"`
	State        string         `json:"state"`
	ExitCode     *int           `json:"exit_code"`
	Chunks       []agentd.Chunk `json:"chunks"`
	NextCursor   uint64         `json:"next_cursor"`
	More         bool           `json:"more"`
	Truncated    bool           `json:"truncated"`
	DroppedBytes uint64         `json:"dropped_bytes"`
	// Approval is the request an exec the rules hold for a person made,
	// while it is pending (approval.go); nil otherwise.
	Approval *ApprovalRef `json:"approval,omitempty"`

	// firstSeq is the id of the first recorded chunk an answer from the
	// recording read (exec records included, which it does not return): 0
	// for agentd's answers.
	firstSeq uint64
}

const (
	maxWait        = 60 * time.Second
	maxCommandLen  = 64 << 10
	replayByteCap  = 1 << 20
	auditFailedMsg = "Nothing was sent to the environment: the operation's audit record could not be written. Try again shortly."
)

// Unrecorded is durable for the terminal bridge: an operation's record (a
// refusal's) could not be written.
func Unrecorded(err error) error { return durable(err) }

// durable reports an operation whose record could not be written: nothing
// was forwarded.
func durable(err error) error {
	if err == nil {
		return nil
	}
	var ae *apperr.Error
	if errors.As(err, &ae) {
		return err
	}
	return apperr.WithCause(apperr.New(apperr.ErrUnavailable, "audit_unavailable", auditFailedMsg), err)
}

func clampWait(ms int64) time.Duration {
	if ms <= 0 {
		return 0
	}
	if ms > maxWait.Milliseconds() {
		return maxWait
	}
	return time.Duration(ms) * time.Millisecond
}

func toOutput(c recordings.Command, r *agentd.SessionResponse) Output {
	chunks := terminalChunks(r.Chunks)
	return Output{CommandID: c.ID, SessionID: c.SessionID, TTY: r.TTY, State: r.State, ExitCode: r.ExitCode, Chunks: chunks,
		NextCursor: r.NextCursor, More: r.More, Truncated: r.Truncated, DroppedBytes: r.DroppedBytes}
}

// sessionCommand resolves the session for act, then reads its command:
// authorized before whether the command exists is said.
func (g *Gateway) sessionCommand(ctx context.Context, org Org, a *authz.Actor, sessionID, commandID int64, act string) (sessions.Target, recordings.Command, error) {
	t, err := resolve(ctx, org, a, sessionID, act, nil)
	if err != nil {
		return t, recordings.Command{}, err
	}
	c, err := recordings.GetInSession(ctx, org.DB, sessionID, commandID)
	return t, c, err
}

// running resolves a command that must still run for act.
func (g *Gateway) running(ctx context.Context, org Org, a *authz.Actor, sessionID, commandID int64, act string) (sessions.Target, recordings.Command, error) {
	t, c, err := g.sessionCommand(ctx, org, a, sessionID, commandID, act)
	if err != nil {
		return t, c, err
	}
	if c.Ended() {
		return t, c, apperr.New(apperr.ErrConflict, "command_ended", "Command %d has ended (%s).", c.ID, c.State)
	}
	return t, c, nil
}
