package recordings

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
)

// StartChecks is what an exec's commit reads before it records the
// command: the session's state (read with a share lock, so a close cannot
// begin under it) and, under the advisory locks named in Locks (taken in
// order), one row of counts. Judge decides from them; an error refuses the
// exec and nothing is written.
type StartChecks struct {
	SessionID int64
	// Locks name store.XactLock locks, taken after the session's row.
	Locks []string
	// CountSQL (with ? placeholders) reads one row of two counts; empty:
	// none.
	CountSQL  string
	CountArgs []any
	Judge     func(s SessionState, counts [2]int64) error
	// Claim, when set, runs in the same commit once the command's id is
	// known (see Claim).
	Claim *Claim
}

// Claim is one more UPDATE an exec's commit runs: SQL (with ?
// placeholders) gets the command's id and then Args; when it changes no
// row the exec is refused with Refused and nothing is written. An
// approved command claims its approval this way, so it starts once.
type Claim struct {
	SQL     string
	Args    []any
	Refused error
}

func (c *Claim) args(id int64) []any { return append([]any{id}, c.Args...) }

// SessionState is the session row as an exec's commit read it.
type SessionState struct {
	State   string
	Closing bool
}

// StartAudited records command c and its audit event ev(c.ID) in one
// commit, after checks, before the command is forwarded. On Postgres it
// costs two round trips: one pipelined batch takes the session's share
// lock, the check locks, the counts, the audit chain's lock, the chain
// head (read under that lock, so the chain cannot fork) and the command's
// id; a second sends both inserts and the COMMIT. SQLite does the same in
// one short transaction (its write lock serializes the chain).
func StartAudited(ctx context.Context, db *gorm.DB, log *audit.Log, chk StartChecks, c *Command, ev func(id int64) audit.Event) error {
	c.State = StateRunning
	c.StartedAt = c.StartedAt.UTC()
	var err error
	if store.DialectOfDB(db) == store.Postgres {
		err = startPostgres(ctx, db, log, chk, c, ev)
	} else {
		err = startSQLite(ctx, db, log, chk, c, ev)
	}
	if err != nil {
		c.ID = 0
	}
	return err
}

// startSQLite is StartAudited's one short transaction.
func startSQLite(ctx context.Context, db *gorm.DB, log *audit.Log, chk StartChecks, c *Command, ev func(id int64) audit.Event) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Plain statements, as on Postgres: the exec's commit is on
		// every command's path, and gorm's builder and reflection cost
		// more CPU here than SQLite's own work.
		conn := tx.Statement.ConnPool
		var s SessionState
		var closing any
		err := conn.QueryRowContext(ctx, "SELECT state, closing_at FROM sessions WHERE id = ?", chk.SessionID).Scan(&s.State, &closing)
		if errors.Is(err, sql.ErrNoRows) {
			err = gorm.ErrRecordNotFound
		}
		if err != nil {
			return fmt.Errorf("read session %d: %w", chk.SessionID, err)
		}
		s.Closing = closing != nil
		var counts [2]int64
		if chk.CountSQL != "" {
			if err := conn.QueryRowContext(ctx, chk.CountSQL, chk.CountArgs...).Scan(&counts[0], &counts[1]); err != nil {
				return fmt.Errorf("count running commands: %w", err)
			}
		}
		if err := chk.Judge(s, counts); err != nil {
			return err
		}
		if err := conn.QueryRowContext(ctx, insertCommand+" RETURNING id", commandArgs(c, false)...).Scan(&c.ID); err != nil {
			return fmt.Errorf("record command: %w", err)
		}
		if cl := chk.Claim; cl != nil {
			res, err := conn.ExecContext(ctx, cl.SQL, cl.args(c.ID)...)
			if err != nil {
				return fmt.Errorf("claim for command: %w", err)
			}
			if n, err := res.RowsAffected(); err != nil || n == 0 {
				return cl.Refused
			}
		}
		_, err = log.AppendTx(ctx, tx, ev(c.ID))
		return err
	})
}

// startPostgres is StartAudited's two pipelined round trips.
func startPostgres(ctx context.Context, db *gorm.DB, log *audit.Log, chk StartChecks, c *Command, ev func(id int64) audit.Event) error {
	var action string
	return store.OnPgConn(ctx, db, func(conn *pgx.Conn) error {
		var s SessionState
		var counts [2]int64
		var head audit.Head
		var closing *time.Time
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue("SELECT state, closing_at FROM sessions WHERE id = $1 FOR SHARE", chk.SessionID).QueryRow(func(r pgx.Row) error {
			err := r.Scan(&s.State, &closing)
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("read session %d: %w", chk.SessionID, gorm.ErrRecordNotFound)
			}
			return err
		})
		for _, l := range chk.Locks {
			b.Queue("SELECT pg_advisory_xact_lock($1)", store.LockKey(l))
		}
		if chk.CountSQL != "" {
			b.Queue(dollars(chk.CountSQL), chk.CountArgs...).QueryRow(func(r pgx.Row) error { return r.Scan(&counts[0], &counts[1]) })
		}
		b.Queue("SELECT pg_advisory_xact_lock($1)", int64(audit.ChainLockKey))
		b.Queue(log.HeadSQL()).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				head.Found = true
				if err := rows.Scan(&head.Seq, &head.Hash, &head.At); err != nil {
					return err
				}
			}
			return rows.Err()
		})
		b.Queue("SELECT nextval(pg_get_serial_sequence('commands', 'id'))").QueryRow(func(r pgx.Row) error { return r.Scan(&c.ID) })
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			return rollback(ctx, conn, fmt.Errorf("record command: %w", err))
		}
		s.Closing = closing != nil
		if err := chk.Judge(s, counts); err != nil {
			return rollback(ctx, conn, err)
		}
		if cl := chk.Claim; cl != nil {
			// A third round trip, only for the commands that claim.
			tag, err := conn.Exec(ctx, dollars(cl.SQL), cl.args(c.ID)...)
			if err != nil {
				return rollback(ctx, conn, fmt.Errorf("claim for command: %w", err))
			}
			if tag.RowsAffected() == 0 {
				return rollback(ctx, conn, cl.Refused)
			}
		}
		e, err := log.Link(ev(c.ID), head)
		if err != nil {
			return rollback(ctx, conn, err)
		}
		action = e.Action
		insert, args := log.InsertSQL(e)
		b = &pgx.Batch{}
		b.Queue(insertCommandPostgres, commandArgs(c, true)...)
		b.Queue(insert, args...)
		b.Queue("COMMIT")
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			err = fmt.Errorf("record command and its audit event: %w", err)
			log.Appended(action, err)
			return rollback(ctx, conn, err)
		}
		log.Appended(action, nil)
		return nil
	})
}

// RunningCountSQL is the running-command caps' count for StartChecks:
// the running commands of the open sessions matching owner (a condition
// on sessions s with one ? placeholder) and of the agent's, each counted
// up to a limit (all a judgement needs: the caller passes one past its
// cap; 0 counts nothing). Its arguments: owner's, the owner limit, the
// agent id, the agent limit. Each count starts from the sessions (the
// partial indexes of open sessions by user, subject and agent) and reads
// their running commands (the partial index of running commands by
// session): CROSS JOIN keeps SQLite's planner in that order, where it
// otherwise scanned every running command of the org on every exec; on
// Postgres it is an inner join the planner orders by its statistics. An
// exec therefore reads the owner's and the agent's open sessions (bounded
// by the open-session caps) and at most the limits' worth of running
// commands, however many commands the org runs.
func RunningCountSQL(owner string) string {
	count := func(who string) string {
		return `(SELECT COUNT(*) FROM (SELECT 1 FROM sessions s CROSS JOIN commands c
			WHERE c.session_id = s.id AND c.state = 'running' AND ` + who + ` AND s.state NOT IN ('closed', 'lost') LIMIT ?) capped)`
	}
	return `SELECT ` + count(owner) + ` AS owner, ` + count("s.agent_id = ?") + ` AS agent`
}

// insertCommand writes the columns a command being started has values for;
// the rest (its end, its output and input so far, its search cursor) take
// their defaults. agentd_acked is written: its default is TRUE (for rows
// older than it), and a new command is not acknowledged.
const (
	newCommandColumns   = "session_id, agentd_id, command, cwd, tty, actor_type, actor_id, actor_name, actor_via, started_at, state, stdin_content, lease_owner, lease_until, agentd_acked"
	insertCommand       = "INSERT INTO commands (" + newCommandColumns + ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
	insertCommandWithID = "INSERT INTO commands (id, " + newCommandColumns + ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

// insertCommandPostgres is insertCommandWithID as the exec's batch sends
// it, numbered once rather than on every exec.
var insertCommandPostgres = dollars(insertCommandWithID)

// commandArgs are insertCommand's arguments (withID: insertCommandWithID's).
func commandArgs(c *Command, withID bool) []any {
	args := []any{c.SessionID, c.AgentdID, c.Command, c.Cwd, c.TTY, c.ActorType, c.ActorID, c.ActorName, c.ActorVia, c.StartedAt,
		c.State, c.StdinContent, c.LeaseOwner, utcPtr(c.LeaseUntil), c.Acked}
	if withID {
		return append([]any{c.ID}, args...)
	}
	return args
}

// rollback ends the transaction a failed batch left open (a failed
// statement makes the server skip the rest of its batch, COMMIT
// included) and returns cause.
func rollback(ctx context.Context, conn *pgx.Conn, cause error) error {
	if conn.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(rctx, "ROLLBACK")
	}
	return cause
}

// dollars numbers a statement's ? placeholders for Postgres ($1, $2, ...);
// the statements given to it have no ? in literals.
func dollars(q string) string {
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
