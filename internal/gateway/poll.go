package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/recorder"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/tenant"
)

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
