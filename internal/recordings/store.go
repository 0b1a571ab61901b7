package recordings

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/clip"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Command states, as agentd names them, plus lost: agentd no longer knows
// the command (its environment restarted).
const (
	StateRunning  = "running"
	StateExited   = "exited"
	StateTimedOut = "timed_out"
	StateKilled   = "killed"
	StateLost     = "lost"
)

// Command is one command run through the gateway.
type Command struct {
	ID           int64 `gorm:"primaryKey"`
	SessionID    int64
	AgentdID     string `gorm:"column:agentd_id"`
	Command      string
	Cwd          string
	TTY          bool `gorm:"column:tty"`
	ActorType    string
	ActorID      string
	ActorName    string
	ActorVia     string // the credential the opener came through (Typist.Via)
	StartedAt    time.Time
	EndedAt      *time.Time
	ExitCode     *int
	State        string
	Reason       string
	OutBytes     int64
	InBytes      int64
	DroppedBytes int64
	Truncated    bool
	LastChunk    int64
	OutHash      string
	InSeq        int64
	InHash       string
	StdinContent bool
	TextCursor   string // how far the output is indexed for search (livetext.go)
	LeaseOwner   string
	LeaseUntil   *time.Time
	// Acked reports that agentd answered the command's create (or a read
	// of it): before that, agentd not knowing it means "not started yet".
	Acked bool `gorm:"column:agentd_acked"`
}

// TableName binds Command to its table.
func (Command) TableName() string { return "commands" }

// ReasonSessionClosed begins the reason of every command its session's
// close ended (killed through agentd, or lost when agentd could not be
// asked): such a command "ended with the session", which pages and the
// API (ended_by: session_close) say instead of a bare killed or lost.
const ReasonSessionClosed = "ended by the session's close"

// EndedBySessionClose reports whether reason is one a session's close
// gave its commands (recorded before they are ended, see MarkEnding).
func EndedBySessionClose(reason string) bool { return strings.HasPrefix(reason, ReasonSessionClosed) }

// Ended reports whether the command reached a final state.
func (c Command) Ended() bool { return c.State != StateRunning }

// Target names a command in the audit log.
func (c Command) Target() audit.Target {
	return audit.Target{Type: "command", ID: strconv.FormatInt(c.ID, 10), Name: clip.String(c.Command, 200)}
}

type frame struct {
	CommandID int64 `gorm:"primaryKey"`
	Kind      string
	FirstSeq  int64
	LastSeq   int64
	StartedAt time.Time
	RawBytes  int
	Body      []byte
	PrevHash  string
	Hash      string
}

func (frame) TableName() string { return "recording_frames" }

// ErrLeaseLost means another replica follows the command now.
var ErrLeaseLost = errors.New("recording: the command's follower lease is held elsewhere")

// Start records a command about to be forwarded, inside the caller's
// transaction (with its audit event).
func Start(ctx context.Context, tx *gorm.DB, c *Command) error {
	c.State = StateRunning
	c.StartedAt = c.StartedAt.UTC()
	if err := tx.WithContext(ctx).Create(c).Error; err != nil {
		return fmt.Errorf("record command: %w", err)
	}
	return nil
}

// Get reads one command.
func Get(ctx context.Context, db *gorm.DB, id int64) (Command, error) {
	return store.ByID[Command](ctx, db, id, "command")
}

// GetInSession reads command id of session sessionID. A command of another
// session is not found, as anything the caller may not see is: a session's
// reader learns nothing of the others' commands.
func GetInSession(ctx context.Context, db *gorm.DB, sessionID, id int64) (Command, error) {
	c, err := Get(ctx, db, id)
	if err != nil {
		return c, err
	}
	if c.SessionID != sessionID {
		return Command{}, authz.NotFound()
	}
	return c, nil
}

// Filter narrows a command listing.
type Filter struct {
	SessionID int64
	State     string
	// Before pages backwards: commands with id < Before (0: from the newest).
	Before int64
	Limit  int
}

// List returns a session's commands, newest first.
func List(ctx context.Context, db *gorm.DB, f Filter) ([]Command, error) {
	if f.Limit <= 0 || f.Limit > 200 {
		f.Limit = 50
	}
	q := db.WithContext(ctx).Where("session_id = ?", f.SessionID)
	if f.State != "" {
		q = q.Where("state = ?", f.State)
	}
	if f.Before > 0 {
		q = q.Where("id < ?", f.Before)
	}
	var out []Command
	if err := q.Order("id DESC").Limit(f.Limit).Find(&out).Error; err != nil {
		return nil, fmt.Errorf("list commands: %w", err)
	}
	return out, nil
}

// forUpdate locks the command row on Postgres (SQLite's transactions hold
// the database's write lock already).
func forUpdate(tx *gorm.DB) *gorm.DB {
	if store.DialectOfDB(tx) == store.Postgres {
		return tx.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	return tx
}

// Output is one batch of output a follower read from agentd.
type Output struct {
	Chunks []Chunk
	// Dropped is how many bytes agentd dropped before these chunks (its
	// ring overflowed); recorded as a gap.
	Dropped uint64
	// NextCursor is agentd's cursor after the batch.
	NextCursor uint64
	// Audit receives the terminal.command events of the batch's exec
	// records, in the same commit (nil: none are written).
	Audit *audit.Log
}

// AppendOutput stores a batch of output chunks for command id as follower
// owner and extends its lease until leaseUntil (unless zero), reading the
// command under a lock first (AppendFollowed is the one-statement form for
// a follower that knows the row). Chunks at or below the recorded cursor are
// skipped, so a batch read twice (a follower that restarted mid-write) is
// never stored twice.
func AppendOutput(ctx context.Context, db *gorm.DB, id int64, owner string, out Output, leaseUntil time.Time) (Command, error) {
	var c Command
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		if c, err = lockOwned(tx, id, owner); err != nil || c.Ended() {
			// An ended command's end event carries its final chain head:
			// nothing may follow it (a follower that lost a race with
			// another replica recording the end finds it ended).
			return err
		}
		updates := map[string]any{}
		if !leaseUntil.IsZero() {
			updates["lease_until"] = leaseUntil.UTC()
		}
		return appendOutputTx(tx, &c, out, updates)
	})
	return c, err
}

// Complete stores the last batch of a command's output and its end in one
// transaction: a command that ended is recorded with one commit.
func Complete(ctx context.Context, db *gorm.DB, log *audit.Log, id int64, owner string, out Output, end End, actor audit.Actor) (Command, error) {
	var c Command
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		if c, err = lockOwned(tx, id, owner); err != nil || c.Ended() {
			return err
		}
		if err := appendOutputTx(tx, &c, out, map[string]any{}); err != nil {
			return err
		}
		return finishTx(ctx, tx, log, &c, end, actor)
	})
	return c, err
}

// lockOwned reads command id for update, as its follower owner ("" for
// anyone).
func lockOwned(tx *gorm.DB, id int64, owner string) (Command, error) {
	var c Command
	if err := forUpdate(tx).Where("id = ?", id).Take(&c).Error; err != nil {
		return c, fmt.Errorf("read command %d: %w", id, err)
	}
	if owner != "" && !c.Ended() && c.LeaseOwner != owner {
		return c, ErrLeaseLost
	}
	return c, nil
}

// appendOutputTx stores out's new chunks as one frame of c and updates c
// (with extra updates) inside tx.
func appendOutputTx(tx *gorm.DB, c *Command, out Output, updates map[string]any) error {
	prev := *c
	f, fresh, more, next, err := planAppend(prev, out)
	if err != nil {
		return err
	}
	*c = next
	for k, v := range more {
		updates[k] = v
	}
	// Searchable as it is stored: the batch's text joins the command's
	// search entry in this transaction (or, within IndexEvery of the last
	// write, with the next one: a poll that brought nothing writes what
	// waited).
	if err := indexOutputTx(tx.Statement.Context, tx, c, prev.LastChunk, fresh, indexTime(fresh), updates); err != nil {
		return err
	}
	if f != nil {
		if err := insertFrame(tx, f); err != nil {
			return fmt.Errorf("store output frame: %w", err)
		}
		// Stored once with the chunks they come from: a batch read twice
		// is skipped above, and so are its events.
		if err := terminalCommandsTx(tx.Statement.Context, tx, out.Audit, *c, fresh); err != nil {
			return err
		}
	}
	if len(updates) == 0 {
		return nil
	}
	return tx.Model(&Command{}).Where("id = ?", c.ID).Updates(updates).Error
}

// AppendInput stores one stdin write (data, and eof when the client closes
// stdin) by typist for command id of session sessionID before it is
// forwarded, and returns the command. The frame opens with its typist, so
// every frame says who typed it. With the command's StdinContent false
// only the size is kept (the org's setting); the typist always is. A
// command of another session is not found; one that ended is a conflict.
// It reads the command under a lock first; AppendInputAfter is the
// one-statement form for a writer that knows the input chain's head.
func AppendInput(ctx context.Context, db *gorm.DB, sessionID, id int64, data []byte, eof bool, at time.Time, typist Typist) (Command, error) {
	var c Command
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := forUpdate(tx).Where("id = ?", id).Take(&c).Error; err != nil {
			if errors.Is(err, gorm.ErrRecordNotFound) {
				return apperr.New(apperr.ErrNotFound, "command_not_found", "No such command.")
			}
			return fmt.Errorf("read command %d: %w", id, err)
		}
		if c.SessionID != sessionID {
			return apperr.New(apperr.ErrNotFound, "command_not_found", "No such command.")
		}
		if c.Ended() {
			return apperr.New(apperr.ErrConflict, "command_ended", "Command %d has ended (%s).", c.ID, c.State)
		}
		if len(data) == 0 && !eof {
			return nil
		}
		f, err := planInput(id, HeadOf(c), data, eof, at, typist)
		if err != nil {
			return err
		}
		if err := insertFrame(tx, &f); err != nil {
			return fmt.Errorf("store input frame: %w", err)
		}
		res := tx.Model(&Command{}).Where("id = ? AND in_seq = ?", id, c.InSeq).
			Updates(map[string]any{"in_seq": f.LastSeq, "in_hash": f.Hash, "in_bytes": c.InBytes + int64(len(data))})
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected != 1 {
			return fmt.Errorf("record stdin of command %d: raced with another writer", id)
		}
		c.InSeq, c.InHash, c.InBytes = f.LastSeq, f.Hash, c.InBytes+int64(len(data))
		return nil
	})
	return c, err
}

// InputHead is where a running command's input chain stands, and whether
// its stdin content is kept: all a writer needs to store the next stdin
// frame without reading the command first.
type InputHead struct {
	Seq          int64
	Hash         string
	StdinContent bool
}

// HeadOf is the input chain head of c as read or written.
func HeadOf(c Command) InputHead {
	return InputHead{Seq: c.InSeq, Hash: c.InHash, StdinContent: c.StdinContent}
}

// planInput is the frame of one stdin write after head: the typist, the
// data (its size only when content is not kept), and the end of stdin.
func planInput(id int64, head InputHead, data []byte, eof bool, at time.Time, typist Typist) (frame, error) {
	seq := uint64(head.Seq) + 1
	chunks := []Chunk{{Seq: seq, Stream: StreamTypist, At: at, Data: encodeTypist(typist)}}
	if len(data) > 0 {
		seq++
		ch := Chunk{Seq: seq, Stream: StreamStdin, At: at, Data: data}
		if !head.StdinContent {
			ch.Data = nil
		}
		chunks = append(chunks, ch)
	}
	if eof {
		seq++
		chunks = append(chunks, Chunk{Seq: seq, Stream: StreamEOF, At: at})
	}
	body, hash, raw, err := encodeFrame(head.Hash, chunks)
	if err != nil {
		return frame{}, err
	}
	return frame{CommandID: id, Kind: KindIn, FirstSeq: int64(chunks[0].Seq), LastSeq: int64(seq), StartedAt: at.UTC(),
		RawBytes: raw, Body: body, PrevHash: head.Hash, Hash: hash}, nil
}

// End is how a command ended.
type End struct {
	State    string
	ExitCode *int
	Reason   string
	At       time.Time
}

// Finish marks command id ended as owner (or as anyone when owner is "",
// for commands found lost) and appends its end event to log in the same
// transaction: the event carries both chain heads and the byte counts.
func Finish(ctx context.Context, db *gorm.DB, log *audit.Log, id int64, owner string, end End, actor audit.Actor) (Command, error) {
	var c Command
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		if c, err = lockOwned(tx, id, owner); err != nil || c.Ended() {
			return err
		}
		return finishTx(ctx, tx, log, &c, end, actor)
	})
	return c, err
}

// MarkEnding records, before running commands ids are ended (their
// session is closing), why they are: the end recorded for each, killed or
// lost, carries reason in place of its own, whichever replica records it.
// Commands that ended already keep their record.
func MarkEnding(ctx context.Context, db *gorm.DB, ids []int64, reason string) error {
	if len(ids) == 0 {
		return nil
	}
	err := db.WithContext(ctx).Model(&Command{}).Where("id IN ? AND state = ?", ids, StateRunning).Update("reason", reason).Error
	if err != nil {
		return fmt.Errorf("record why commands end: %w", err)
	}
	return nil
}

// finishTx records c's end and its end event inside tx.
func finishTx(ctx context.Context, tx *gorm.DB, log *audit.Log, c *Command, end End, actor audit.Actor) error {
	at := endCommand(c, end)
	updates := map[string]any{"state": c.State, "exit_code": c.ExitCode,
		"reason": c.Reason, "ended_at": at, "lease_owner": "", "lease_until": nil}
	// The search entry, written batch by batch while the command ran, is
	// completed with the end, so every ended command is searchable to its
	// end (or neither happened).
	if err := indexEndTx(ctx, tx, c, updates); err != nil {
		return err
	}
	if err := tx.Model(&Command{}).Where("id = ?", c.ID).Updates(updates).Error; err != nil {
		return err
	}
	_, err := log.AppendTx(ctx, tx, endEvent(*c, actor))
	return err
}

// endCommand sets c's end (state, exit code, reason, time) and returns
// its time as stored; the lease goes with it.
func endCommand(c *Command, end End) time.Time {
	if c.Reason != "" && (end.State == StateKilled || end.State == StateLost) {
		// MarkEnding said why it is being ended; a command that exited
		// or timed out on its own meanwhile keeps its own account.
		end.Reason = c.Reason
	}
	at := end.At.UTC()
	c.State, c.ExitCode, c.Reason, c.EndedAt = end.State, end.ExitCode, end.Reason, &at
	c.LeaseOwner, c.LeaseUntil = "", nil
	return at
}

// endEvent is the audit event of c's end.
func endEvent(c Command, actor audit.Actor) audit.Event {
	return audit.Event{Actor: actor, Action: "command.end", Target: c.Target(), Decision: audit.Allow, Details: audit.Details(EndDetails(c))}
}

// EndDetails is what a command's end event records: enough to verify its
// recording against the audit log.
func EndDetails(c Command) map[string]any {
	d := map[string]any{"session_id": c.SessionID, "state": c.State, "exit_code": c.ExitCode, "duration_ms": duration(c).Milliseconds(),
		"output_bytes": c.OutBytes, "input_bytes": c.InBytes, "dropped_bytes": c.DroppedBytes, "truncated": c.Truncated,
		"output_chunks": c.LastChunk, "input_chunks": c.InSeq, "output_hash": c.OutHash, "input_hash": c.InHash}
	if c.Reason != "" {
		d["reason"] = c.Reason
	}
	return d
}

func duration(c Command) time.Duration {
	if c.EndedAt == nil {
		return 0
	}
	return c.EndedAt.Sub(c.StartedAt)
}

// Acquire makes owner the follower of command id when nobody holds a live
// lease on it. It reports whether owner holds it now.
func Acquire(ctx context.Context, db *gorm.DB, id int64, owner string, now, until time.Time) (bool, error) {
	res := db.WithContext(ctx).Model(&Command{}).
		Where("id = ? AND state = ? AND (lease_owner = '' OR lease_owner = ? OR lease_until IS NULL OR lease_until < ?)", id, StateRunning, owner, now.UTC()).
		Updates(map[string]any{"lease_owner": owner, "lease_until": until.UTC()})
	if res.Error != nil {
		return false, fmt.Errorf("acquire command %d: %w", id, res.Error)
	}
	return res.RowsAffected == 1, nil
}

// Unfollowed lists running commands whose follower lease has lapsed (a
// replica that died or restarted), oldest first.
func Unfollowed(ctx context.Context, db *gorm.DB, now time.Time, limit int) ([]Command, error) {
	var out []Command
	err := db.WithContext(ctx).Where("state = ? AND (lease_until IS NULL OR lease_until < ?)", StateRunning, now.UTC()).
		Order("id").Limit(limit).Find(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list unfollowed commands: %w", err)
	}
	return out, nil
}

// Read returns all of a command's recorded chunks of kind (KindOut or
// KindIn) in order, as Walk reads them: for tests. It does not check the
// hash chain (Verify does).
func Read(ctx context.Context, db *gorm.DB, id int64, kind string) ([]Chunk, error) {
	var out []Chunk
	err := Walk(ctx, db, id, kind, func(c Chunk) error {
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Verification is the outcome of checking one command's recording.
type Verification struct {
	OK         bool   `json:"ok"`
	CommandID  int64  `json:"command_id"`
	Problem    string `json:"problem,omitempty"`
	OutputHash string `json:"output_hash"`
	InputHash  string `json:"input_hash"`
	OutBytes   int64  `json:"output_bytes"`
	InBytes    int64  `json:"input_bytes"`
}

// Verify recomputes both chains of command id from the stored frames and
// compares them with want (the heads its end event recorded), reading the
// frames a page at a time.
func Verify(ctx context.Context, db *gorm.DB, id int64, wantOut, wantIn string) (Verification, error) {
	v := Verification{CommandID: id}
	for _, kind := range []string{KindOut, KindIn} {
		head := ChainStart
		var n int64
		last := int64(0)
		err := eachFrame(ctx, db, id, kind, math.MinInt64, func(f frame, cs []Chunk) error {
			if f.PrevHash != head || len(cs) == 0 || int64(cs[0].Seq) <= last {
				v.Problem = fmt.Sprintf("%s frame at %d does not follow the one before", kind, f.FirstSeq)
				return errStop
			}
			for _, c := range cs {
				head = chainHash(head, c)
				if countsAsOutput(c.Stream) {
					n += int64(len(c.Data))
				}
			}
			if head != f.Hash {
				v.Problem = fmt.Sprintf("%s frame at %d was changed", kind, f.FirstSeq)
				return errStop
			}
			last = int64(cs[len(cs)-1].Seq)
			return nil
		})
		var fe *frameError
		if errors.As(err, &fe) {
			v.Problem = fmt.Sprintf("%s frame at %d cannot be read", kind, fe.firstSeq)
			return v, nil
		}
		if err != nil {
			return v, err
		}
		if v.Problem != "" {
			return v, nil
		}
		if kind == KindOut {
			v.OutputHash, v.OutBytes = head, n
		} else {
			v.InputHash, v.InBytes = head, n
		}
	}
	switch {
	case v.OutputHash != wantOut:
		v.Problem = "the output recording does not match its end event"
	case v.InputHash != wantIn:
		v.Problem = "the input recording does not match its end event"
	default:
		v.OK = true
	}
	return v, nil
}

// ReadAfter returns the chunks of kind after seq, in order, up to about
// maxBytes of data (at least one chunk), reading only the frames that hold
// them; more says whether chunks remain.
func ReadAfter(ctx context.Context, db *gorm.DB, id int64, kind string, after uint64, maxBytes int) (chunks []Chunk, more bool, err error) {
	total := 0 // bytes of data in chunks
	err = eachFrame(ctx, db, id, kind, int64(after), func(_ frame, cs []Chunk) error {
		for _, c := range cs {
			if c.Seq <= after {
				continue
			}
			if len(chunks) > 0 && total+len(c.Data) > maxBytes {
				more = true
				return errStop
			}
			chunks = append(chunks, c)
			total += len(c.Data)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return chunks, more, nil
}
