package recordings

import (
	"context"
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
// whichever form stores it.
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
		c, applied, err = inputPostgres(db, head, sessionID, f, int64(len(data)))
	} else {
		c, applied, err = inputSQLite(db, head, sessionID, f, int64(len(data)))
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
// frame was planned with head's choice.
const inputUpdate = `UPDATE commands SET in_seq = ?, in_hash = ?, in_bytes = in_bytes + ?
	WHERE id = ? AND session_id = ? AND state = 'running' AND in_seq = ? AND in_hash = ? AND stdin_content = ?
	RETURNING *`

func inputUpdateArgs(head InputHead, sessionID int64, f frame, n int64) []any {
	return []any{f.LastSeq, f.Hash, n, f.CommandID, sessionID, head.Seq, head.Hash, head.StdinContent}
}

// inputPostgres is AppendInputAfter's single statement: the frame is
// inserted from the updated row, so it is stored exactly when the command
// moved to its hash.
func inputPostgres(db *gorm.DB, head InputHead, sessionID int64, f frame, n int64) (Command, bool, error) {
	args := append(inputUpdateArgs(head, sessionID, f, n), f.Kind, f.FirstSeq, f.LastSeq, f.StartedAt, f.RawBytes, f.Body, f.PrevHash, f.Hash)
	var cs []Command
	err := db.Raw(`WITH u AS (`+inputUpdate+`),
		f AS (INSERT INTO recording_frames (command_id, kind, first_seq, last_seq, started_at, raw_bytes, body, prev_hash, hash)
			SELECT id, ?, ?, ?, ?, ?, ?, ?, ? FROM u)
		SELECT * FROM u`, args...).Scan(&cs).Error
	if err != nil || len(cs) != 1 {
		return Command{}, false, err
	}
	return cs[0], true, nil
}

// inputSQLite is AppendInputAfter's short transaction: the conditional
// update first (it takes the write lock), then the frame.
func inputSQLite(db *gorm.DB, head InputHead, sessionID int64, f frame, n int64) (Command, bool, error) {
	var c Command
	applied := false
	err := db.Transaction(func(tx *gorm.DB) error {
		var cs []Command
		if err := tx.Raw(inputUpdate, inputUpdateArgs(head, sessionID, f, n)...).Scan(&cs).Error; err != nil || len(cs) != 1 {
			return err
		}
		if err := tx.Create(&f).Error; err != nil {
			return fmt.Errorf("store input frame: %w", err)
		}
		c, applied = cs[0], true
		return nil
	})
	return c, applied, err
}
