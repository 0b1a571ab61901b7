package recordings

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
)

// errNeedsLock stops planning a command's end without its lock: the
// search entry lags behind the recording and must read it (Complete's
// locking form does).
var errNeedsLock = errors.New("recording: the end needs the command's row locked")

// CompleteFollowed stores the last batch of output of c, the command as
// its follower owner last wrote it, and its end with the command.end
// event, as Complete does. On Postgres it costs two round trips: the
// frame is compressed before any lock; one pipelined batch takes the
// command's row lock, reads the output the search entry lags behind (the
// batches within IndexEvery), takes the audit chain's lock and reads the
// chain head under it (so the chain cannot fork); a second writes the
// frame, the search entry, the command's end and its event, and COMMITs.
// A row that moved on from c (another writer), a long lag, or a batch
// with terminal.command events take Complete's locking form. SQLite takes it
// always (one short transaction; its write lock serializes the chain).
func CompleteFollowed(ctx context.Context, db *gorm.DB, log *audit.Log, c Command, owner string, out Output, end End, actor audit.Actor) (Command, error) {
	if store.DialectOfDB(db) != store.Postgres {
		return Complete(ctx, db, log, c.ID, owner, out, end, actor)
	}
	f, fresh, _, next, err := planAppend(c, out)
	if err != nil {
		return c, err
	}
	if auditsCommands(c, out, fresh) {
		return Complete(ctx, db, log, c.ID, owner, out, end, actor)
	}
	// Output the search entry lags behind (batches within IndexEvery) is
	// read in the locked batch, once the row says it is as c has it.
	cur := readCursor(c)
	lags := !cur.Capped && cur.Seq < uint64(c.LastChunk)
	var lagged []frame
	if lags {
		lagged = []frame{}
	}
	var ended Command
	moved := false
	err = store.OnPgConn(ctx, db, func(conn *pgx.Conn) error {
		var row Command
		var head audit.Head
		bt := &pgx.Batch{}
		bt.Queue("BEGIN")
		bt.Queue("SELECT "+commandColumns+" FROM commands WHERE id = $1 FOR UPDATE", c.ID).QueryRow(func(r pgx.Row) error {
			err := scanCommand(r, &row)
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("read command %d: %w", c.ID, gorm.ErrRecordNotFound)
			}
			return err
		})
		if lags {
			bt.Queue(`SELECT first_seq, body FROM recording_frames WHERE command_id = $1 AND kind = $2 AND last_seq > $3 AND first_seq <= $4
				AND first_seq >= COALESCE((SELECT MAX(first_seq) FROM recording_frames WHERE command_id = $1 AND kind = $2 AND first_seq <= $3), $3)
				ORDER BY first_seq LIMIT $5`, c.ID, KindOut, int64(cur.Seq), c.LastChunk, laggedFrames+1).Query(func(rows pgx.Rows) error {
				for rows.Next() {
					var f frame
					if err := rows.Scan(&f.FirstSeq, &f.Body); err != nil {
						return err
					}
					lagged = append(lagged, f)
				}
				return rows.Err()
			})
		}
		bt.Queue("SELECT pg_advisory_xact_lock($1)", int64(audit.ChainLockKey))
		bt.Queue(log.HeadSQL()).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				head.Found = true
				if err := rows.Scan(&head.Seq, &head.Hash, &head.At); err != nil {
					return err
				}
			}
			return rows.Err()
		})
		if err := conn.SendBatch(ctx, bt).Close(); err != nil {
			return rollback(ctx, conn, err)
		}
		switch {
		case row.Ended():
			// Recorded already (another replica, or a retry): its end
			// event carries the final chain head; nothing follows it.
			ended = row
			return rollback(ctx, conn, nil)
		case owner != "" && row.LeaseOwner != owner:
			return rollback(ctx, conn, ErrLeaseLost)
		case !sameOutput(row, c) || len(lagged) > laggedFrames:
			moved = true
			return rollback(ctx, conn, nil)
		}
		texts, textCursor, err := planEndIndex(c, next, fresh, lagged)
		if err != nil {
			moved = errors.Is(err, errNeedsLock)
			return rollback(ctx, conn, err)
		}
		next.TextCursor = textCursor
		// The row as locked (its input chain, the reason a close gave it),
		// with the output as planned.
		ended = row
		ended.Acked, ended.OutHash, ended.LastChunk, ended.OutBytes = true, next.OutHash, next.LastChunk, next.OutBytes
		ended.DroppedBytes, ended.Truncated, ended.TextCursor = next.DroppedBytes, next.Truncated, next.TextCursor
		at := endCommand(&ended, end)
		e, err := log.Link(endEvent(ended, actor), head)
		if err != nil {
			return rollback(ctx, conn, err)
		}
		bt = &pgx.Batch{}
		if f != nil {
			bt.Queue(`INSERT INTO recording_frames (command_id, kind, first_seq, last_seq, started_at, raw_bytes, body, prev_hash, hash)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, f.CommandID, f.Kind, f.FirstSeq, f.LastSeq, f.StartedAt, f.RawBytes, f.Body, f.PrevHash, f.Hash)
		}
		for _, t := range texts {
			bt.Queue(textUpsertPg, t.CommandID, t.Command, t.Body, t.Times, t.Capped)
		}
		bt.Queue(`UPDATE commands SET agentd_acked = TRUE, out_hash = $2, last_chunk = $3, out_bytes = $4, dropped_bytes = $5, truncated = $6,
			text_cursor = $7, state = $8, exit_code = $9, reason = $10, ended_at = $11, lease_owner = '', lease_until = NULL WHERE id = $1`,
			ended.ID, ended.OutHash, ended.LastChunk, ended.OutBytes, ended.DroppedBytes, ended.Truncated,
			ended.TextCursor, ended.State, ended.ExitCode, ended.Reason, at)
		insert, args := log.InsertSQL(e)
		bt.Queue(insert, args...)
		bt.Queue("COMMIT")
		if err := conn.SendBatch(ctx, bt).Close(); err != nil {
			err = fmt.Errorf("record the end of command %d: %w", c.ID, err)
			log.Appended(e.Action, err)
			return rollback(ctx, conn, err)
		}
		log.Appended(e.Action, nil)
		return nil
	})
	if moved {
		return Complete(ctx, db, log, c.ID, owner, out, end, actor)
	}
	if err != nil {
		return c, err
	}
	return ended, nil
}

// laggedFrames bounds the recorded frames an end reads to complete the
// search entry in its locked batch; more take Complete's paging form.
const laggedFrames = 256

// planEndIndex is what the end of c (next once the batch fresh is stored)
// adds to the search entry, as Complete's indexOutputTx and indexEndTx
// would write it, reading the output the entry lags behind from lagged
// (the frames above its cursor), and the text cursor after it.
func planEndIndex(c, next Command, fresh []Chunk, lagged []frame) ([]*textEntry, string, error) {
	catchUp := func(b *textBatch, upTo uint64) error {
		if lagged == nil {
			return errNeedsLock
		}
		// The recorded frames, then the batch stored with the end (not
		// in the table yet: it is written in the same batch).
		for _, f := range append(lagged, frame{Body: nil}) {
			cs := fresh
			if f.Body != nil {
				var err error
				if cs, err = decodeFrame(f.Body); err != nil {
					// Indexed as far as it can be read; verification
					// reports the damage.
					return nil
				}
			}
			for _, ch := range cs {
				if ch.Seq > upTo || !b.add(ch) {
					return nil
				}
			}
		}
		return nil
	}
	var texts []*textEntry
	updates := map[string]any{} // the cursor, written with the end's columns
	b, err := planIndexOutput(next, c.LastChunk, fresh, indexTime(fresh), catchUp)
	if err != nil {
		return nil, "", err
	}
	if b != nil {
		if e := b.entry(&next, updates); e != nil {
			texts = append(texts, e)
		}
	}
	if b, err = planIndexEnd(next, catchUp); err != nil {
		return nil, "", err
	}
	if e := b.entry(&next, updates); e != nil {
		texts = append(texts, e)
	}
	return texts, next.TextCursor, nil
}

// sameOutput reports whether row's recorded output is where the follower's
// c says (the batch planned after c follows it).
func sameOutput(row, c Command) bool {
	return row.LastChunk == c.LastChunk && row.OutHash == c.OutHash && row.OutBytes == c.OutBytes &&
		row.DroppedBytes == c.DroppedBytes && row.Truncated == c.Truncated && row.TextCursor == c.TextCursor
}

// commandColumns are the columns scanCommand reads, in its order.
const commandColumns = `id, session_id, agentd_id, command, cwd, tty, actor_type, actor_id, actor_name, actor_via, started_at, ended_at,
	exit_code, state, reason, out_bytes, in_bytes, dropped_bytes, truncated, last_chunk, out_hash, in_seq, in_hash, stdin_content,
	text_cursor, lease_owner, lease_until, agentd_acked`

func scanCommand(r pgx.Row, c *Command) error {
	var exit *int32
	err := r.Scan(&c.ID, &c.SessionID, &c.AgentdID, &c.Command, &c.Cwd, &c.TTY, &c.ActorType, &c.ActorID, &c.ActorName, &c.ActorVia,
		&c.StartedAt, &c.EndedAt, &exit, &c.State, &c.Reason, &c.OutBytes, &c.InBytes, &c.DroppedBytes, &c.Truncated, &c.LastChunk,
		&c.OutHash, &c.InSeq, &c.InHash, &c.StdinContent, &c.TextCursor, &c.LeaseOwner, &c.LeaseUntil, &c.Acked)
	if exit != nil {
		n := int(*exit)
		c.ExitCode = &n
	}
	c.StartedAt = c.StartedAt.UTC()
	c.EndedAt, c.LeaseUntil = utcPtr(c.EndedAt), utcPtr(c.LeaseUntil)
	return err
}
