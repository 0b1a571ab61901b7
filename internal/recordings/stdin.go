package recordings

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/store"
)

// AppendInputAfter stores one stdin write as AppendInput does, for a
// writer that knows head, the command's input chain as this replica last
// left it: one round trip on Postgres (one statement that updates the
// command and inserts the frame, both only if the command is session
// sessionID's, still running and its chain still ends at head), one short
// transaction on SQLite. When the row is not as head says (another replica
// wrote, the command ended, head is stale), nothing is written by that
// statement and AppendInput, which reads the command under its lock,
// decides and answers (a conflict for an ended command, not found for
// another session's). A keystroke is thus stored once, in chain order,
// whichever form stores it. The command comes back with the columns
// inputColumns names filled (the locking form fills every one).
func AppendInputAfter(ctx context.Context, db *gorm.DB, head InputHead, sessionID, id int64, data []byte, eof bool, at time.Time, typist Typist) (Command, error) {
	if len(data) == 0 && !eof {
		// Nothing to store: only the checks, which the locking form makes.
		return AppendInput(ctx, db, sessionID, id, data, eof, at, typist)
	}
	f, err := planInput(id, head, data, eof, at, typist)
	if err != nil {
		return Command{}, err
	}
	db = db.WithContext(ctx)
	var c Command
	var applied bool
	if store.DialectOfDB(db) == store.Postgres {
		c, applied, err = inputPostgres(ctx, db, head, sessionID, f, int64(len(data)))
	} else {
		c, applied, err = inputSQLite(ctx, db, head, sessionID, f, int64(len(data)))
	}
	if err != nil {
		return Command{}, fmt.Errorf("store input of command %d: %w", id, err)
	}
	if applied {
		return c, nil
	}
	return AppendInput(ctx, db, sessionID, id, data, eof, at, typist)
}

// inputUpdate is the conditional update both engines run: it matches only
// the command as head says it is. stdin_content is matched too, since the
// frame was planned with head's choice. It returns inputColumns.
const inputUpdate = `UPDATE commands SET in_seq = ?, in_hash = ?, in_bytes = in_bytes + ?
	WHERE id = ? AND session_id = ? AND state = 'running' AND in_seq = ? AND in_hash = ? AND stdin_content = ?
	RETURNING ` + inputColumns

// inputColumns are the command's columns a keystroke's statement returns:
// what the gateway forwards with (agentd_id), whether it still runs,
// whether agentd ever answered for it (an "unknown" from agentd then means
// it ended lost, not that it has not started), and its input head for the
// next keystroke. A keystroke is the gateway's
// hottest write, so it is sent as plain SQL and scanned by hand: through
// gorm, building the statement, formatting it for a discarded log and
// scanning the whole row by reflection cost more CPU than the database's
// own work (about 220 µs a keystroke, measured on the bench's profile).
const inputColumns = "id, session_id, agentd_id, state, in_seq, in_hash, in_bytes, stdin_content, agentd_acked"

// frameInsert begins the insert of a frame (input or output): insertFrame
// gives it VALUES; the one-statement Postgres forms take the command's id
// from their update, so the frame is stored exactly when that matched.
const frameInsert = `INSERT INTO recording_frames (command_id, kind, first_seq, last_seq, started_at, raw_bytes, body, prev_hash, hash)`

// insertFrame stores f with a plain statement on tx's connection (see
// inputColumns for why not through gorm).
func insertFrame(tx *gorm.DB, f *frame) error {
	q := frameValuesSQL
	if store.DialectOfDB(tx) == store.Postgres {
		q = frameValuesPostgres
	}
	_, err := tx.Statement.ConnPool.ExecContext(tx.Statement.Context, q, append([]any{f.CommandID}, frameArgs(*f)...)...)
	return err
}

var (
	frameValuesSQL      = frameInsert + ` VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`
	frameValuesPostgres = dollars(frameValuesSQL)
)

func inputUpdateArgs(head InputHead, sessionID int64, f frame, n int64) []any {
	return []any{f.LastSeq, f.Hash, n, f.CommandID, sessionID, head.Seq, head.Hash, head.StdinContent}
}

func frameArgs(f frame) []any {
	return []any{f.Kind, f.FirstSeq, f.LastSeq, f.StartedAt, f.RawBytes, f.Body, f.PrevHash, f.Hash}
}

func scanInput(row *sql.Row) (Command, bool, error) {
	var c Command
	err := row.Scan(&c.ID, &c.SessionID, &c.AgentdID, &c.State, &c.InSeq, &c.InHash, &c.InBytes, &c.StdinContent, &c.Acked)
	if errors.Is(err, sql.ErrNoRows) {
		return Command{}, false, nil
	}
	if err != nil {
		return Command{}, false, err
	}
	return c, true, nil
}

// inputPostgres is AppendInputAfter's single statement: the frame is
// inserted from the updated row, so it is stored exactly when the command
// moved to its hash.
func inputPostgres(ctx context.Context, db *gorm.DB, head InputHead, sessionID int64, f frame, n int64) (Command, bool, error) {
	args := append(inputUpdateArgs(head, sessionID, f, n), frameArgs(f)...)
	return scanInput(db.Statement.ConnPool.QueryRowContext(ctx, inputPostgresSQL, args...))
}

var inputPostgresSQL = dollars(`WITH u AS (` + inputUpdate + `),
	f AS (` + frameInsert + ` SELECT id, ?, ?, ?, ?, ?, ?, ?, ? FROM u)
	SELECT ` + inputColumns + ` FROM u`)

// inputSQLite is AppendInputAfter's short transaction: the conditional
// update first (it takes the write lock), then the frame.
func inputSQLite(ctx context.Context, db *gorm.DB, head InputHead, sessionID int64, f frame, n int64) (Command, bool, error) {
	var c Command
	applied := false
	err := db.Transaction(func(tx *gorm.DB) error {
		var err error
		pool := tx.Statement.ConnPool
		if c, applied, err = scanInput(pool.QueryRowContext(ctx, inputUpdate, inputUpdateArgs(head, sessionID, f, n)...)); err != nil || !applied {
			return err
		}
		if err := insertFrame(tx, &f); err != nil {
			applied = false
			return fmt.Errorf("store input frame: %w", err)
		}
		return nil
	})
	return c, applied, err
}
