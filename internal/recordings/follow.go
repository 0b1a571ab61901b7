package recordings

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/store"
)

// auditsCommands says whether storing fresh writes terminal.command
// events (exec records of an interactive shell): those go in the same
// commit as their chunks, by the locking form.
func auditsCommands(c Command, out Output, fresh []Chunk) bool {
	if out.Audit == nil || !c.TTY {
		return false
	}
	for _, ch := range fresh {
		if ch.Stream == StreamExec {
			return true
		}
	}
	return false
}

// freshChunks is what of out is new after c: a gap chunk for what agentd
// dropped, then the chunks above c's cursor, in order.
func freshChunks(c Command, out Output) []Chunk {
	var fresh []Chunk
	if out.Dropped > 0 {
		// The gap takes the id just before the first chunk that survived,
		// which agentd never returned to anyone.
		at := time.Now()
		if len(out.Chunks) > 0 {
			at = out.Chunks[0].At
		}
		gapSeq := uint64(c.LastChunk) + 1
		if len(out.Chunks) > 0 && out.Chunks[0].Seq > gapSeq {
			gapSeq = out.Chunks[0].Seq - 1
		}
		fresh = append(fresh, Chunk{Seq: gapSeq, Stream: StreamGap, At: at, Data: []byte(strconv.FormatUint(out.Dropped, 10))})
	}
	for _, ch := range out.Chunks {
		if int64(ch.Seq) > c.LastChunk && (len(fresh) == 0 || ch.Seq > fresh[len(fresh)-1].Seq) {
			fresh = append(fresh, ch)
		}
	}
	return fresh
}

// planAppend works out what storing out after c takes: the frame of its
// new chunks (nil when none), those chunks, the command's updated columns, and c as it
// will be once they are written. Chunks at or below c's cursor are
// skipped, so a batch read twice is never stored twice.
func planAppend(c Command, out Output) (*frame, []Chunk, map[string]any, Command, error) {
	updates := map[string]any{}
	if !c.Acked {
		// Whatever is stored here, agentd answered for the command.
		c.Acked, updates["agentd_acked"] = true, true
	}
	fresh := freshChunks(c, out)
	if len(fresh) == 0 {
		return nil, nil, updates, c, nil
	}
	body, head, raw, err := encodeFrame(c.OutHash, fresh)
	if err != nil {
		return nil, nil, nil, c, err
	}
	f := &frame{CommandID: c.ID, Kind: KindOut, FirstSeq: int64(fresh[0].Seq), LastSeq: int64(fresh[len(fresh)-1].Seq),
		StartedAt: fresh[0].At.UTC(), RawBytes: raw, Body: body, PrevHash: c.OutHash, Hash: head}
	notOutput := int64(0) // the gap's count and exec records
	for _, ch := range fresh {
		if !countsAsOutput(ch.Stream) {
			notOutput += int64(len(ch.Data))
		}
	}
	c.OutHash, c.LastChunk = head, f.LastSeq
	c.OutBytes += int64(raw) - notOutput
	c.DroppedBytes += int64(out.Dropped)
	c.Truncated = c.Truncated || out.Dropped > 0
	updates["out_hash"], updates["last_chunk"], updates["out_bytes"] = c.OutHash, c.LastChunk, c.OutBytes
	updates["dropped_bytes"], updates["truncated"] = c.DroppedBytes, c.Truncated
	return f, fresh, updates, c, nil
}

// AppendFollowed stores a batch of output after c, the command as its
// follower owner last wrote it, in one round trip on Postgres (one
// statement: the frame's insert and the command's update, both only if
// the row still is as c says and owner still holds its lease). A batch
// with nothing new writes nothing: the lease is renewed per replica
// (RenewLeases), not per batch. When the row moved on (another writer,
// the command ended, the lease lost), it falls back to AppendOutput,
// which reads it under a lock and decides.
func AppendFollowed(ctx context.Context, db *gorm.DB, c Command, owner string, out Output) (Command, error) {
	f, fresh, updates, next, err := planAppend(c, out)
	if err != nil {
		return c, err
	}
	if indexDue(c, c.LastChunk, fresh, indexTime(fresh)) || auditsCommands(c, out, fresh) {
		// The search entry is written with this batch (at most once per
		// IndexEvery per command): the locking form, which reads what
		// the entry needs under the row's lock.
		return AppendOutput(ctx, db, c.ID, owner, out, time.Time{})
	}
	if len(updates) == 0 {
		return c, nil
	}
	db = db.WithContext(ctx)
	var applied bool
	if store.DialectOfDB(db) == store.Postgres {
		applied, err = appendPostgres(db, c, owner, f, next)
	} else {
		applied, err = appendSQLite(db, c, owner, f, updates)
	}
	if err != nil {
		return c, err
	}
	if applied {
		return next, nil
	}
	return AppendOutput(ctx, db, c.ID, owner, out, time.Time{})
}

// appendPostgres is AppendFollowed's single statement.
func appendPostgres(db *gorm.DB, c Command, owner string, f *frame, next Command) (bool, error) {
	args := []any{c.ID, owner, c.LastChunk, c.OutHash}
	q := appendOutputSQL
	if f != nil {
		q = appendOutputFrameSQL
		args = append(args, frameArgs(*f)...)
	}
	args = append(args, next.OutHash, next.LastChunk, next.OutBytes, next.DroppedBytes, next.Truncated)
	// A plain statement, as a keystroke's (inputColumns says why).
	var id int64
	err := db.Statement.ConnPool.QueryRowContext(db.Statement.Context, q, args...).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store output of command %d: %w", c.ID, err)
	}
	return true, nil
}

// appendOutputSQL and appendOutputFrameSQL are appendPostgres's statement
// without and with a frame to store.
var appendOutputSQL, appendOutputFrameSQL = appendOutput(""), appendOutput(`, f AS (` + frameInsert + ` SELECT id, ?, ?, ?, ?, ?, ?, ?, ? FROM cur)`)

func appendOutput(insert string) string {
	return dollars(`WITH cur AS (SELECT id FROM commands WHERE id = ? AND lease_owner = ? AND state = 'running'
			AND last_chunk = ? AND out_hash = ? FOR UPDATE)` + insert + `
		UPDATE commands SET agentd_acked = TRUE, out_hash = ?, last_chunk = ?, out_bytes = ?, dropped_bytes = ?, truncated = ?
		WHERE id IN (SELECT id FROM cur) RETURNING id`)
}

// appendSQLite is AppendFollowed's short transaction: the conditional
// update first (it takes the write lock), then the frame.
func appendSQLite(db *gorm.DB, c Command, owner string, f *frame, updates map[string]any) (bool, error) {
	applied := false
	err := db.Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&Command{}).Where("id = ? AND lease_owner = ? AND state = ? AND last_chunk = ? AND out_hash = ?",
			c.ID, owner, StateRunning, c.LastChunk, c.OutHash).Updates(updates)
		if res.Error != nil || res.RowsAffected != 1 {
			return res.Error
		}
		applied = true
		if f == nil {
			return nil
		}
		if err := insertFrame(tx, f); err != nil {
			return fmt.Errorf("store output frame: %w", err)
		}
		return nil
	})
	return applied, err
}

// renewBatch bounds the ids of one renewal statement (far below either
// engine's limit on parameters).
const renewBatch = 10_000

// RenewLeases extends owner's leases on the running commands ids (those
// this replica follows) until until: one statement per replica per
// interval, however many commands it follows, in place of a write per
// command. A command whose follower stopped without recording its end is
// no longer listed, so its lease lapses and a sweep adopts it. It reports
// how many leases it renewed.
func RenewLeases(ctx context.Context, db *gorm.DB, owner string, ids []int64, until time.Time) (int64, error) {
	var n int64
	for len(ids) > 0 {
		part := ids[:min(len(ids), renewBatch)]
		ids = ids[len(part):]
		res := db.WithContext(ctx).Model(&Command{}).Where("lease_owner = ? AND state = ? AND id IN ?", owner, StateRunning, part).
			Update("lease_until", until.UTC())
		if res.Error != nil {
			return n, fmt.Errorf("renew follower leases: %w", res.Error)
		}
		n += res.RowsAffected
	}
	return n, nil
}
