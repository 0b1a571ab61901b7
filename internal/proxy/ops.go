package proxy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/recorder"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/tenant"
)

// ExecRequest runs a command in a session; the fields mirror agentd's.
type ExecRequest struct {
	Command   string            `json:"command"`
	Cwd       string            `json:"cwd,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	TTY       bool              `json:"tty,omitempty"`
	Rows      uint16            `json:"rows,omitempty"`
	Cols      uint16            `json:"cols,omitempty"`
	Stdin     bool              `json:"stdin,omitempty"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"`
	WaitMS    int64             `json:"wait_ms,omitempty"`
}

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

func newAgentdID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "gh-" + hex.EncodeToString(b[:])
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

// envKeys lists the names of the variables an exec sets, in order.
func envKeys(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k := range env {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// envHashes maps each variable an exec sets to the SHA-256 (hex) of its
// value: the audit log shows what ran without holding the values, which
// may be secrets, and a value known to an investigator can be matched.
func envHashes(env map[string]string) map[string]string {
	out := make(map[string]string, len(env))
	for k, v := range env {
		sum := sha256.Sum256([]byte(v))
		out[k] = hex.EncodeToString(sum[:])
	}
	return out
}

// Exec runs a command in session sessionID: authorized, recorded and
// audited in one commit before agentd hears of it, then followed until it
// ends.
func (g *Gateway) Exec(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID int64, req ExecRequest) (Output, error) {
	if strings.TrimSpace(req.Command) == "" || len(req.Command) > maxCommandLen {
		return Output{}, &apperr.ValidationError{Fields: map[string]string{"command": "Give the command to run, at most 64 KiB."}}
	}
	if req.TimeoutMS < 0 || req.WaitMS < 0 {
		return Output{}, &apperr.ValidationError{Fields: map[string]string{"timeout_ms": "timeout_ms and wait_ms cannot be negative."}}
	}
	t, err := resolve(ctx, org, a, sessionID, ActExec, func(t sessions.Target) error { return policyCheck(a, t, req.Command, req.Env) })
	if err != nil {
		return Output{}, err
	}
	now := g.now()
	lease := now.Add(g.Followers.LeaseFor())
	cmd := recordings.Command{SessionID: sessionID, AgentdID: newAgentdID(), Command: req.Command, Cwd: inWorkspace(t, req.Cwd), TTY: req.TTY,
		ActorType: a.Kind, ActorID: a.ID, ActorName: a.Name, ActorVia: recordings.TypistOf(&a.Principal).Via, StartedAt: now, LeaseOwner: g.Followers.Owner, LeaseUntil: &lease}
	if cmd.StdinContent, err = g.stdinContent(ctx, org); err != nil {
		return Output{}, durable(err)
	}
	// One commit: the command's record and its audit event, before agentd
	// hears of it (two round trips on Postgres).
	committing := time.Now()
	err = recordings.StartAudited(ctx, org.DB, org.Audit, g.startChecks(a, t), &cmd, func(id int64) audit.Event {
		return event(a, m, "command.exec", cmd.Target(), map[string]any{"session_id": sessionID,
			"command_id": id, "command": req.Command, "cwd": cmd.Cwd, "tty": req.TTY, "env_keys": envKeys(req.Env), "env_sha256": envHashes(req.Env), "timeout_ms": req.TimeoutMS})
	})
	if err != nil {
		return Output{}, durable(err)
	}
	g.recorded(RecordedExec, committing)
	wait := clampWait(req.WaitMS)
	fctx, cancel := context.WithTimeout(ctx, wait+g.callTimeout())
	defer cancel()
	create := agentd.CreateSessionRequest{ID: cmd.AgentdID, Command: req.Command, Cwd: cmd.Cwd, Env: req.Env,
		TTY: req.TTY, Rows: req.Rows, Cols: req.Cols, Stdin: req.Stdin, TimeoutMS: req.TimeoutMS,
		// What ran in it, from the kernel, for the recording and (on a
		// TTY) the audit log; an agentd without it ignores the ask.
		ExecRecords: true,
		// agentd holds output back until the recorder has read it, so the
		// recording is complete however fast the command writes.
		Overflow: agentd.OverflowBlock}
	// Until agentd answers, the follower may send the create again (a
	// follower that meets "unknown" before the create arrived).
	g.Followers.CreatePending(org.rec(), cmd.ID, create)
	create.WaitMS = wait.Milliseconds()
	resp, err := g.client(t).CreateSession(fctx, create)
	var ae *agentd.Error
	if errors.As(err, &ae) && ae.Code == agentd.CodeIDInUse && !ae.Foreign {
		// The follower sent the create again while this one was on its
		// way, and that one arrived first: the command runs, once.
		g.Followers.CreateDone(org.rec(), cmd.ID)
		g.remember(org, cmd)
		g.Followers.Follow(org.Slug, cmd.ID)
		return Output{CommandID: cmd.ID, SessionID: sessionID, TTY: req.TTY, State: agentd.StateRunning, Chunks: []agentd.Chunk{}}, nil
	}
	if errors.As(err, &ae) && ae.Status < 500 && !ae.Foreign {
		// agentd refused the command: it never ran. Its record ends here.
		g.Followers.CreateDone(org.rec(), cmd.ID)
		g.reachable(ctx, org, t)
		g.Followers.FinishRefused(ctx, org.rec(), cmd, ae)
		if ae.Code == agentd.CodeKilledFirst {
			// The session's close killed it before its create arrived.
			return Output{}, errSessionClosing(sessionID)
		}
		return Output{}, fromAgentd(ae)
	}
	// From here the command may be running whatever agentd answered: the
	// follower finds out and records it, starting from agentd's answer.
	// Its input chain is empty: its first keystroke is one statement.
	g.remember(org, cmd)
	g.inputs.store(knownKey{db: org.DB, id: cmd.ID}, cmd)
	if err != nil {
		// No answer: the follower reads the command, and sends the create
		// again while agentd does not know it.
		g.Followers.Follow(org.Slug, cmd.ID)
		return Output{}, mayStillStart(g.upstream(ctx, org, t, err), cmd.ID)
	}
	g.Followers.CreateDone(org.rec(), cmd.ID)
	g.Followers.FollowNew(org.rec(), cmd, resp)
	g.reachable(ctx, org, t)
	return toOutput(cmd, resp), nil
}

func toOutput(c recordings.Command, r *agentd.SessionResponse) Output {
	chunks := terminalChunks(r.Chunks)
	return Output{CommandID: c.ID, SessionID: c.SessionID, TTY: r.TTY, State: r.State, ExitCode: r.ExitCode, Chunks: chunks,
		NextCursor: r.NextCursor, More: r.More, Truncated: r.Truncated, DroppedBytes: r.DroppedBytes}
}

// terminalChunks is chunks without exec records: those go to the
// recording (and the audit log), never to a terminal or an output poll,
// whose cursors still pass over them (next_cursor does).
func terminalChunks(chunks []agentd.Chunk) []agentd.Chunk {
	out := chunks[:0:0]
	for _, ch := range chunks {
		if ch.Stream != agentd.StreamExec {
			out = append(out, ch)
		}
	}
	if len(out) == len(chunks) && chunks != nil {
		return chunks
	}
	return out
}

// pastExecRecords reads output after cursor with read until until: an
// answer holding only exec records (which readers are not given) is no
// reason to end the wait, so it reads on past them.
func pastExecRecords(until time.Time, cursor uint64, read func(cursor uint64, wait time.Duration) (*agentd.SessionResponse, error)) (*agentd.SessionResponse, error) {
	resp, err := read(cursor, max(time.Until(until), 0))
	for err == nil && resp != nil && onlyExecRecords(resp) {
		left := time.Until(until)
		if left <= 0 {
			break
		}
		resp, err = read(resp.NextCursor, left)
	}
	return resp, err
}

// onlyExecRecords reports an answer of a running command whose chunks are
// all exec records, with nothing after them yet.
func onlyExecRecords(r *agentd.SessionResponse) bool {
	if r.State != agentd.StateRunning || r.More || r.Truncated || len(r.Chunks) == 0 {
		return false
	}
	for _, ch := range r.Chunks {
		if ch.Stream != agentd.StreamExec {
			return false
		}
	}
	return true
}

// Poll long-polls a command's output after cursor, as agentd does. A
// command that ended and is fully recorded is answered from its recording,
// so its output stays readable after agentd forgot it or the sandbox was
// paused.
func (g *Gateway) Poll(ctx context.Context, org Org, a *authz.Actor, sessionID, commandID int64, cursor uint64, waitMS int64) (Output, error) {
	t, live, err := resolveRecorded(ctx, org, a, sessionID)
	if err != nil {
		return Output{}, err
	}
	k, ok := g.recall(org, commandID)
	if !ok || !live {
		c, err := recordings.GetInSession(ctx, org.DB, sessionID, commandID)
		if err != nil {
			return Output{}, err
		}
		if !live && !c.Ended() {
			// Its session ended: its follower records it as lost.
			g.Followers.Follow(org.Slug, c.ID)
		}
		if c.Ended() || !live {
			return g.fromRecording(ctx, org, c, cursor)
		}
		g.remember(org, c)
		k = knownCommand{sessionID: c.SessionID, agentdID: c.AgentdID, tty: c.TTY}
	}
	if k.sessionID != sessionID {
		return Output{}, authz.NotFound()
	}
	wait := clampWait(waitMS)
	pctx, cancel := context.WithTimeout(ctx, wait+g.callTimeout())
	defer cancel()
	// A suspended or deleted org ends its long-polls at once.
	pctx, stop := tenant.BindRevoked(pctx, org.Revoked)
	defer stop()
	// The command's follower on this replica read its output already:
	// polls are answered from that, and agentd serves each byte once.
	until := time.Now().Add(wait) // the wait is real time, whatever the clock
	var st recorder.LiveStatus
	resp, err := pastExecRecords(until, cursor, func(cursor uint64, wait time.Duration) (r *agentd.SessionResponse, err error) {
		r, st, err = g.Followers.ReadLive(pctx, org.Slug, org.DB, commandID, cursor, wait)
		if st != recorder.LiveAnswered {
			return nil, err // nothing to go on past
		}
		return r, err
	})
	switch {
	case err == nil && st == recorder.LiveAnswered:
		out := toOutput(recordings.Command{ID: commandID, SessionID: sessionID}, resp)
		out.TTY = k.tty
		return out, nil
	case err == nil && st == recorder.LiveBehind:
		// Behind what the follower keeps: the recording has it.
		if rec, rerr := g.fromRecordingOf(ctx, org, commandID, cursor); rerr == nil && rec.NextCursor > cursor {
			if rec.State == recordings.StateRunning {
				rec.More = true
			}
			rec.TTY = k.tty
			return rec, nil
		}
	}
	if err == nil {
		// Not followed here: its follower here just recorded its end (the
		// client is behind it), another replica follows it, or its
		// follower waits out a failure. An ended command is read from
		// its recording; otherwise a reader peeks, as only the recorder
		// lets agentd drop what it read.
		if c, gerr := recordings.Get(ctx, org.DB, commandID); gerr == nil && c.Ended() {
			return g.fromRecording(ctx, org, c, cursor)
		}
		resp, err = pastExecRecords(until, cursor, func(cursor uint64, wait time.Duration) (*agentd.SessionResponse, error) {
			return g.peek(pctx, t, k.agentdID, cursor, wait)
		})
	}
	var ae *agentd.Error
	if errors.As(err, &ae) && ae.Unknown() {
		// agentd no longer knows it (its environment restarted, or it
		// reclaimed the ended session): what was recorded is what there is.
		g.Followers.Follow(org.Slug, commandID)
		return g.fromRecordingOf(ctx, org, commandID, cursor)
	}
	if err != nil {
		// Ended by the org's revocation: answered with its cause (a
		// deleted org says so, not that it was suspended).
		if rerr := revokedErr(org); rerr != nil {
			return Output{}, rerr
		}
		// Ended by the caller's own revocation (signed out, key revoked):
		// answered with why.
		if cause := EndedBy(ctx); cause != nil {
			return Output{}, cause
		}
		return Output{}, g.upstream(ctx, org, t, err)
	}
	g.reachable(ctx, org, t)
	if resp.Truncated && resp.DroppedBytes > 0 {
		// This reader fell behind agentd's buffer; the recorder did not
		// (agentd holds output for it), so the stored recording has what
		// this reader missed.
		if rec, err := g.fromRecordingOf(ctx, org, commandID, cursor); err == nil && rec.firstSeq == cursor+1 {
			rec.State, rec.ExitCode, rec.More, rec.TTY = agentd.StateRunning, nil, true, k.tty
			return rec, nil
		}
	}
	out := toOutput(recordings.Command{ID: commandID, SessionID: sessionID}, resp)
	out.TTY = k.tty
	return out, nil
}

// fromRecordingOf answers a poll of command id from the stored output,
// reading the command first.
func (g *Gateway) fromRecordingOf(ctx context.Context, org Org, id int64, cursor uint64) (Output, error) {
	c, err := recordings.Get(ctx, org.DB, id)
	if err != nil {
		return Output{}, err
	}
	return g.fromRecording(ctx, org, c, cursor)
}

// fromRecording answers a poll of c, as just read, from the stored output.
func (g *Gateway) fromRecording(ctx context.Context, org Org, c recordings.Command, cursor uint64) (Output, error) {
	chunks, more, err := recordings.ReadAfter(ctx, org.DB, c.ID, recordings.KindOut, cursor, replayByteCap)
	if err != nil {
		return Output{}, err
	}
	out := Output{CommandID: c.ID, SessionID: c.SessionID, TTY: c.TTY, State: c.State, ExitCode: c.ExitCode, Chunks: []agentd.Chunk{},
		NextCursor: cursor, More: more, Truncated: c.Truncated, DroppedBytes: uint64(c.DroppedBytes)}
	if !c.Ended() {
		out.State = recordings.StateRunning
		out.ExitCode = nil
	}
	for _, ch := range chunks {
		out.NextCursor = ch.Seq
		if out.firstSeq == 0 && ch.Stream != recordings.StreamGap {
			out.firstSeq = ch.Seq
		}
		if ch.Stream != recordings.StreamGap && ch.Stream != recordings.StreamExec {
			out.Chunks = append(out.Chunks, agentd.Chunk{ID: ch.Seq, Stream: ch.Stream, Data: ch.Data})
		}
	}
	if !out.More && c.Ended() && uint64(c.LastChunk) > out.NextCursor {
		out.NextCursor = uint64(c.LastChunk)
	}
	return out, nil
}

// Stdin writes to a running command. The bytes are recorded (or, by the
// org's choice, only their size) with their typist before agentd receives
// them; an API client's first keystroke into a command someone else
// opened is audited as command.attach first.
func (g *Gateway) Stdin(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID, commandID int64, data []byte, eof bool) error {
	var t sessions.Target
	var c recordings.Command
	var err error
	if len(data) == 0 && !eof {
		if t, c, err = g.running(ctx, org, a, sessionID, commandID, ActStdin); err != nil {
			return err
		}
	} else {
		if t, err = resolve(ctx, org, a, sessionID, ActStdin, nil); err != nil {
			return err
		}
		if err := g.typing(ctx, org, a, m, sessionID, commandID); err != nil {
			return err
		}
		// One commit, which also checks the command is this session's and
		// still running; closing stdin is recorded too.
		committing := time.Now()
		if c, err = g.appendInput(ctx, org, recordings.TypistOf(&a.Principal), sessionID, commandID, data, eof); err != nil {
			return durable(err)
		}
		g.recorded(RecordedStdin, committing)
	}
	fctx, cancel := context.WithTimeout(ctx, g.callTimeout())
	defer cancel()
	if err := g.client(t).WriteStdin(fctx, c.AgentdID, data, eof); err != nil {
		return g.commandUpstream(ctx, org, t, c, err)
	}
	g.reachable(ctx, org, t)
	return nil
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

// Watch opens command commandID of a session read-only, audited
// (command.watch): the read the watch page made, and the one Poll makes,
// so a command of a closed session is replayed from its recording.
func (g *Gateway) Watch(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID, commandID int64) error {
	t, _, err := resolveRecorded(ctx, org, a, sessionID)
	if err != nil {
		return err
	}
	c, err := recordings.GetInSession(ctx, org.DB, sessionID, commandID)
	if err != nil {
		return err
	}
	if _, err := org.Audit.Append(ctx, event(a, m, "command.watch", c.Target(), map[string]any{"session_id": t.Session.ID})); err != nil {
		return durable(err)
	}
	return nil
}

// Continue checks that a may go on typing into command commandID of a
// session (a terminal reconnecting): authorized before anything, even
// whether the command exists, is said. A command that ended meanwhile is
// not refused: the terminal gets the output it missed and the end.
func (g *Gateway) Continue(ctx context.Context, org Org, a *authz.Actor, sessionID, commandID int64) error {
	_, _, err := g.sessionCommand(ctx, org, a, sessionID, commandID, ActStdin)
	return err
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

// Kill ends a command and everything it started, audited; the follower
// records its end.
func (g *Gateway) Kill(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID, commandID int64) (Output, error) {
	t, c, err := g.running(ctx, org, a, sessionID, commandID, ActKill)
	if err != nil {
		return Output{}, err
	}
	if _, err := org.Audit.Append(ctx, event(a, m, "command.kill", c.Target(), map[string]any{"session_id": sessionID})); err != nil {
		return Output{}, durable(err)
	}
	fctx, cancel := context.WithTimeout(ctx, g.callTimeout())
	defer cancel()
	resp, err := g.client(t).Kill(fctx, c.AgentdID)
	if err != nil {
		return Output{}, g.commandUpstream(ctx, org, t, c, err)
	}
	g.Followers.Follow(org.Slug, c.ID)
	return toOutput(c, resp), nil
}

// AuthorizeRead checks that a may read session sessionID's recorded
// commands (their history, output and replay), live or ended.
func (g *Gateway) AuthorizeRead(ctx context.Context, org Org, a *authz.Actor, sessionID int64) error {
	_, _, err := resolveRecorded(ctx, org, a, sessionID)
	return err
}

// Commands lists a session's commands, newest first.
func (g *Gateway) Commands(ctx context.Context, org Org, a *authz.Actor, f recordings.Filter) ([]recordings.Command, error) {
	if _, _, err := resolveRecorded(ctx, org, a, f.SessionID); err != nil {
		return nil, err
	}
	return recordings.List(ctx, org.DB, f)
}

// ReadFile reads part of a file in the session's environment, audited.
//
// The bytes are not held: the caller passes the returned Body on as it
// arrives and closes it (closing ends the read's deadline). Body yields at
// most limit bytes (0: agentd's maximum) and fails rather than yield more.
// The read is audited before agentd hears of it.
func (g *Gateway) ReadFile(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID int64, p string, offset, limit int64) (*agentd.FileRange, error) {
	if err := validateRead(p, offset, limit); err != nil {
		return nil, err
	}
	t, err := resolve(ctx, org, a, sessionID, ActFilesRead, nil)
	if err != nil {
		return nil, err
	}
	full := inWorkspace(t, p)
	if _, err := org.Audit.Append(ctx, event(a, m, "file.read", sessions.AuditTarget(t.Session),
		map[string]any{"path": full, "offset": offset, "limit": limit})); err != nil {
		return nil, durable(err)
	}
	// The usual call timeout bounds agentd's answer to begin; the bytes
	// then flow at the client's pace, within fileReadTimeout.
	fctx, cancel := context.WithTimeout(ctx, fileReadTimeout)
	begun := time.AfterFunc(g.callTimeout(), cancel)
	f, err := g.client(t).OpenFile(fctx, full, offset, limit)
	begun.Stop()
	if err != nil {
		cancel()
		return nil, g.upstream(ctx, org, t, err)
	}
	f.Body = &fileBody{Reader: f.Body, body: f.Body, cancel: cancel}
	return f, nil
}

// CopyFile passes a file ReadFile opened on to w as agentd sends it, each
// read flushed to the client at once: net/http holds the tail of a write
// (up to its 4 KiB buffer) until the next one, so the last bytes agentd
// sent so far waited for its next ones, and a file whose writer waits on
// its reader (a pipe, a growing log) stalled (TestTerminalFileReadStreams
// failed now and then on it).
func CopyFile(w http.ResponseWriter, body io.Reader) (int64, error) {
	return io.Copy(flushEach{w: w, rc: http.NewResponseController(w)}, body)
}

type flushEach struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushEach) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		if ferr := f.rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
			err = ferr
		}
	}
	return n, err
}

// Stat describes paths in the session's environment, audited.
func (g *Gateway) Stat(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID int64, paths []string) ([]agentd.FileStat, error) {
	t, err := resolve(ctx, org, a, sessionID, ActFilesRead, nil)
	if err != nil {
		return nil, err
	}
	full := make([]string, len(paths))
	for i, p := range paths {
		full[i] = inWorkspace(t, p)
	}
	if _, err := org.Audit.Append(ctx, event(a, m, "file.stat", sessions.AuditTarget(t.Session), map[string]any{"paths": full})); err != nil {
		return nil, durable(err)
	}
	fctx, cancel := context.WithTimeout(ctx, g.callTimeout())
	defer cancel()
	res, err := g.client(t).Stat(fctx, full...)
	if err != nil {
		return nil, g.upstream(ctx, org, t, err)
	}
	return res, nil
}

// Fetch downloads a URL into a file of the session's environment, audited.
// Its size and duration are checked first: a refused fetch is neither
// audited nor forwarded.
func (g *Gateway) Fetch(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID int64, req agentd.FetchRequest) (*agentd.FetchResponse, error) {
	if err := validateFetch(req); err != nil {
		return nil, err
	}
	t, err := resolve(ctx, org, a, sessionID, ActFilesFetch, nil)
	if err != nil {
		return nil, err
	}
	req.Path = inWorkspace(t, req.Path)
	details := map[string]any{"url": req.URL, "path": req.Path, "max_bytes": req.MaxBytes, "timeout_ms": req.TimeoutMS}
	if req.Unpack != "" {
		details["unpack"] = req.Unpack
	}
	if req.SHA256 != "" {
		details["sha256"] = req.SHA256
	}
	if _, err := org.Audit.Append(ctx, event(a, m, "file.fetch", sessions.AuditTarget(t.Session), details)); err != nil {
		return nil, durable(err)
	}
	fctx, cancel := context.WithTimeout(ctx, g.fetchDeadline(req.TimeoutMS))
	defer cancel()
	res, err := g.client(t).Fetch(fctx, req)
	if err != nil {
		return nil, g.upstream(ctx, org, t, err)
	}
	return res, nil
}

// mayStillStart tells the caller of an exec that got no answer that the
// command is recorded and may still start (its follower sends the create
// again once the environment answers): running it again would run it
// twice.
func mayStillStart(err error, id int64) error {
	var ae *apperr.Error
	if !errors.As(err, &ae) || ae.Code != "environment_unreachable" {
		return err
	}
	return apperr.New(ae.Kind, ae.Code, "%s Command %d is recorded and may still start once the environment answers: "+
		"check its state (GET …/commands/%d/output) before running it again.", ae.Message, id, id)
}
