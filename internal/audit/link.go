package audit

import (
	"fmt"
	"time"
)

// ChainLockKey is the Postgres advisory lock (transaction scoped) that
// serializes appends to an org's or the platform's chain. A writer that
// links events itself (Link) takes it before reading the head, so the
// chain cannot fork.
const ChainLockKey = chainLockKey

// Head is the chain's last event as read under the chain lock; Found is
// false for an empty log.
type Head struct {
	Found bool
	Seq   int64
	Hash  string
	At    time.Time
}

// HeadSQL reads the log's head: one row of seq, hash and occurred_at, or
// none on an empty log. Run it under the chain lock.
func (l *Log) HeadSQL() string {
	return "SELECT seq, hash, occurred_at FROM " + l.table + " ORDER BY seq DESC LIMIT 1"
}

// Link prepares e and links it to head, as Append does: for writers that
// read the head themselves in a pipelined batch (the exec's commit) and
// insert the event with InsertSQL in the same transaction.
func (l *Log) Link(e Event, head Head) (Event, error) {
	e, err := prepare(e)
	if err != nil {
		return Event{}, err
	}
	return l.link(e, head), nil
}

// link links a prepared event to head. Its time is taken under the chain
// lock and never earlier than the event before, so occurred_at does not
// decrease along the chain even across replicas with skewed clocks: Query
// relies on it to turn a time range into a seq range. Postgres keeps
// microseconds; the hash covers what the database will give back.
func (l *Log) link(e Event, head Head) Event {
	e.Time = l.now().UTC().Truncate(time.Microsecond)
	if head.Found && e.Time.Before(head.At) {
		e.Time = head.At.UTC()
	}
	e.Seq, e.PrevHash = head.Seq+1, head.Hash
	e.Hash = Hash(e)
	return e
}

// InsertSQL is the Postgres statement ($n placeholders) storing a linked
// event, with its arguments.
func (l *Log) InsertSQL(e Event) (string, []any) {
	r := toRow(e)
	return fmt.Sprintf(`INSERT INTO %s (seq, occurred_at, actor_type, actor_id, actor_name, source_ip, user_agent, action,
		target_type, target_id, target_name, decision, details, prev_hash, hash)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`, l.table),
		[]any{r.Seq, r.OccurredAt, r.ActorType, r.ActorID, r.ActorName, r.SourceIP, r.UserAgent, r.Action,
			r.TargetType, r.TargetID, r.TargetName, r.Decision, r.Details, r.PrevHash, r.Hash}
}

// Appended reports an event written by a writer that linked it itself
// (Link) to the log's observer, as Append does.
func (l *Log) Appended(action string, err error) { l.report(action, err) }
