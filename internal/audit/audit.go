// Package audit holds the hash-chained audit log shared by the platform
// catalog and every org database: the event type, appends serialized per
// database so the chain never forks, verification, and review queries.
package audit

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/store"
)

// Table names of the two logs; both have the same columns.
const (
	PlatformTable = "platform_audit_events"
	OrgTable      = "audit_events"
)

// Actor types.
const (
	ActorUser          = "user"
	ActorAPIKey        = "api_key"
	ActorPlatformAdmin = "platform_admin"
	ActorSystem        = "system"
	ActorAnonymous     = "anonymous"
)

// Decisions.
const (
	Allow = "allow"
	Deny  = "deny"
)

// Actor is who did something.
type Actor struct {
	Type string `json:"type"`
	ID   string `json:"id"`
	Name string `json:"name"`
}

// Target is what it was done to.
type Target struct {
	Type string `json:"type"`
	ID   string `json:"id"`
	Name string `json:"name"`
}

// Event is one audit record. Seq, PrevHash and Hash are assigned on append.
type Event struct {
	Seq       int64           `json:"seq"`
	Time      time.Time       `json:"time"`
	Actor     Actor           `json:"actor"`
	SourceIP  string          `json:"source_ip"`
	UserAgent string          `json:"user_agent"`
	Action    string          `json:"action"`
	Target    Target          `json:"target"`
	Decision  string          `json:"decision"`
	Details   json.RawMessage `json:"details"`
	PrevHash  string          `json:"prev_hash"`
	Hash      string          `json:"hash"`
}

// row is the table shape; kept private so the JSON shape of Event is a
// decision rather than a side effect of the schema.
type row struct {
	Seq        int64     `gorm:"column:seq;primaryKey;autoIncrement:false"`
	OccurredAt time.Time `gorm:"column:occurred_at"`
	ActorType  string    `gorm:"column:actor_type"`
	ActorID    string    `gorm:"column:actor_id"`
	ActorName  string    `gorm:"column:actor_name"`
	SourceIP   string    `gorm:"column:source_ip"`
	UserAgent  string    `gorm:"column:user_agent"`
	Action     string    `gorm:"column:action"`
	TargetType string    `gorm:"column:target_type"`
	TargetID   string    `gorm:"column:target_id"`
	TargetName string    `gorm:"column:target_name"`
	Decision   string    `gorm:"column:decision"`
	Details    string    `gorm:"column:details"`
	PrevHash   string    `gorm:"column:prev_hash"`
	Hash       string    `gorm:"column:hash"`
}

func toRow(e Event) row {
	return row{
		Seq: e.Seq, OccurredAt: e.Time, ActorType: e.Actor.Type, ActorID: e.Actor.ID, ActorName: e.Actor.Name,
		SourceIP: e.SourceIP, UserAgent: e.UserAgent, Action: e.Action,
		TargetType: e.Target.Type, TargetID: e.Target.ID, TargetName: e.Target.Name,
		Decision: e.Decision, Details: string(e.Details), PrevHash: e.PrevHash, Hash: e.Hash,
	}
}

func fromRow(r row) Event {
	return Event{
		Seq: r.Seq, Time: r.OccurredAt.UTC(), Actor: Actor{r.ActorType, r.ActorID, r.ActorName},
		SourceIP: r.SourceIP, UserAgent: r.UserAgent, Action: r.Action,
		Target: Target{r.TargetType, r.TargetID, r.TargetName}, Decision: r.Decision,
		Details: json.RawMessage(r.Details), PrevHash: r.PrevHash, Hash: r.Hash,
	}
}

// Log appends to and reads one database's audit table.
type Log struct {
	db    *gorm.DB
	table string
	now   func() time.Time
	// mu serializes appends within this process; the database lock does it
	// across replicas. Holding both keeps SQLite from queueing on busy
	// timeouts under heavy concurrency.
	mu sync.Mutex
	// textWindow is the direct-scan window of free-text queries.
	textWindow int64
	// observe, when set, hears of every append (for metrics).
	observe Observer
}

// Observer hears of each append to a log: which log ("platform" or
// "org"), the event's action, and the error if it failed. An append inside
// a caller's transaction (AppendTx) is reported when written, before the
// transaction commits.
type Observer func(log, action string, err error)

// Observe sets the log's observer; call it right after NewLog, before the
// log is shared.
func (l *Log) Observe(o Observer) *Log {
	l.observe = o
	return l
}

func (l *Log) report(action string, err error) {
	if l.observe == nil {
		return
	}
	name := "org"
	if l.table == PlatformTable {
		name = "platform"
	}
	l.observe(name, action, err)
}

// NewLog returns the log stored in table of db. now may be nil.
func NewLog(db *gorm.DB, table string, now func() time.Time) *Log {
	if now == nil {
		now = time.Now
	}
	return &Log{db: db, table: table, now: now, textWindow: defaultTextWindow}
}

// chainLockKey is the per-database advisory lock serializing appends on
// Postgres (advisory locks are scoped to the current database).
const chainLockKey = 7_470_117_032_002

// Append assigns the next sequence number, links the event to the previous
// hash and stores it. Callers treat an error as "do not proceed": an action
// that cannot be audited is not performed.
func (l *Log) Append(ctx context.Context, e Event) (Event, error) {
	e, err := prepare(e)
	if err != nil {
		return Event{}, err
	}
	action := e.Action
	l.mu.Lock()
	defer l.mu.Unlock()
	err = l.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		e, err = l.appendIn(tx, e)
		return err
	})
	l.report(action, err)
	if err != nil {
		return Event{}, err
	}
	return e, nil
}

// AppendTx appends inside the caller's transaction on the same database,
// so a change and its audit record commit together or not at all. It does
// not take the in-process lock: the transaction's database lock (SQLite's
// write lock, a Postgres advisory lock) serializes the chain, and taking
// the mutex while holding a write lock would deadlock with Append.
func (l *Log) AppendTx(ctx context.Context, tx *gorm.DB, e Event) (Event, error) {
	e, err := prepare(e)
	if err != nil {
		return Event{}, err
	}
	action := e.Action
	e, err = l.appendIn(tx.WithContext(ctx), e)
	l.report(action, err)
	return e, err
}

func prepare(e Event) (Event, error) {
	e = sanitize(e)
	if e.Action == "" || e.Actor.Type == "" {
		return Event{}, fmt.Errorf("audit event needs an action and an actor type")
	}
	if e.Decision == "" {
		e.Decision = Allow
	}
	if len(e.Details) == 0 {
		e.Details = json.RawMessage("{}")
	}
	canon, err := canonicalJSON(e.Details)
	if err != nil {
		return Event{}, fmt.Errorf("audit details: %w", err)
	}
	e.Details = canon
	return e, nil
}

// lockChain takes the chain's transaction lock on Postgres (SQLite's write
// lock serializes writers already).
func lockChain(tx *gorm.DB) error {
	if store.DialectOfDB(tx) == store.Postgres {
		if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", chainLockKey).Error; err != nil {
			return fmt.Errorf("lock audit chain: %w", err)
		}
	}
	return nil
}

// appendIn links e to the chain head and inserts it within tx.
func (l *Log) appendIn(tx *gorm.DB, e Event) (Event, error) {
	if err := lockChain(tx); err != nil {
		return Event{}, err
	}
	// Plain statements on the transaction's connection: every audited
	// write pays for this append, and through gorm's builder and
	// reflection it cost more CPU than the database's own work.
	ctx, conn := tx.Statement.Context, tx.Statement.ConnPool
	if ctx == nil {
		ctx = context.Background()
	}
	var head Head
	switch err := conn.QueryRowContext(ctx, l.HeadSQL()).Scan(&head.Seq, &head.Hash, &head.At); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return Event{}, fmt.Errorf("read chain head: %w", err)
	default:
		head.Found = true
	}
	e = l.link(e, head)
	insert, args := l.InsertSQL(e)
	if _, err := conn.ExecContext(ctx, insert, args...); err != nil {
		return Event{}, fmt.Errorf("insert audit event: %w", err)
	}
	return e, nil
}

// hashed is the canonical form an event's hash covers: every field but the
// hash itself, in a fixed order.
type hashed struct {
	Seq       int64           `json:"seq"`
	Time      string          `json:"time"`
	Actor     Actor           `json:"actor"`
	SourceIP  string          `json:"source_ip"`
	UserAgent string          `json:"user_agent"`
	Action    string          `json:"action"`
	Target    Target          `json:"target"`
	Decision  string          `json:"decision"`
	Details   json.RawMessage `json:"details"`
}

// Hash computes sha256(prev_hash || canonical JSON of the event) in hex.
func Hash(e Event) string {
	details, err := canonicalJSON(e.Details)
	if err != nil {
		details = e.Details
	}
	b, _ := json.Marshal(hashed{
		Seq: e.Seq, Time: e.Time.UTC().Format(time.RFC3339Nano), Actor: e.Actor, SourceIP: e.SourceIP,
		UserAgent: e.UserAgent, Action: e.Action, Target: e.Target, Decision: e.Decision, Details: details,
	})
	h := sha256.New()
	h.Write([]byte(e.PrevHash))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// canonicalJSON re-encodes JSON with sorted object keys and no spaces.
func canonicalJSON(raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) == 0 {
		return json.RawMessage("{}"), nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// Details marshals v for Event.Details; a value that cannot be marshalled
// is recorded as an error string rather than dropped.
func Details(v any) json.RawMessage {
	if v == nil {
		return json.RawMessage("{}")
	}
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"marshal_error": err.Error()})
	}
	return b
}

// VerifyResult says whether the chain is intact and where it first breaks.
type VerifyResult struct {
	OK bool `json:"ok"`
	// Checked counts the events verified before the first break.
	Checked int64 `json:"checked"`
	// BrokenAt is the first sequence number that fails: a missing one, one
	// whose link to the event before does not match, or one whose content
	// no longer matches its hash.
	BrokenAt int64  `json:"broken_at,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// HeadSeq and HeadHash are the last verified event. The chain cannot
	// show that events were cut off its end; an anchor recorded outside
	// its database can (see Anchor and WithAnchor).
	HeadSeq  int64  `json:"head_seq,omitempty"`
	HeadHash string `json:"head_hash,omitempty"`
	// StartSeq and StartPrevHash say where verification started when it
	// did not start at the chain's first event: after a retention
	// checkpoint, or at the first event of an archive. StartPrevHash must
	// equal the hash that ends the archive before it.
	StartSeq      int64  `json:"start_seq,omitempty"`
	StartPrevHash string `json:"start_prev_hash,omitempty"`
	// Anchor is the comparison with the checkpoints kept outside the
	// log's database, when there are any.
	Anchor *AnchorCheck `json:"anchor,omitempty"`
	// Checkpoints is the check of those checkpoints themselves (their
	// signatures and their signed order), when there are any.
	Checkpoints *CheckpointCheck `json:"checkpoints,omitempty"`
	// Filtered says a file was a filtered export, whose chain cannot be
	// checked: not OK, and not broken either (BrokenAt is 0).
	Filtered bool `json:"filtered,omitempty"`
}

// CheckpointCheck is what checking the kept checkpoints of a log found:
// each must carry a valid signature by the org's key and name, signed,
// the checkpoint kept before it; the newest must be the newest the
// platform log recorded.
type CheckpointCheck struct {
	OK bool `json:"ok"`
	// Checked counts the checkpoints whose signature was checked.
	Checked  int                 `json:"checked"`
	Problems []CheckpointProblem `json:"problems,omitempty"`
}

// CheckpointProblem is one edited, forged or missing stretch of
// checkpoints, by the sequence numbers of the events they record.
type CheckpointProblem struct {
	FromSeq    int64  `json:"from_seq"`
	ThroughSeq int64  `json:"through_seq"`
	Reason     string `json:"reason"`
}

// WithCheckpoints folds a check of the checkpoints into a verification:
// a checkpoint that was edited, forged or deleted fails it, even when
// the chain itself links.
func (r VerifyResult) WithCheckpoints(cc CheckpointCheck) VerifyResult {
	r.Checkpoints = &cc
	if cc.OK {
		return r
	}
	var reasons []string
	for _, p := range cc.Problems {
		reasons = append(reasons, p.Reason)
	}
	reason := "the checkpoints kept outside the log were tampered with: " + strings.Join(reasons, "; ")
	if !r.OK {
		r.Reason += "; also, " + reason
		return r
	}
	r.OK, r.Reason = false, reason
	return r
}

// Verify walks the whole chain in sequence order, in batches, and reports
// the first row whose sequence, link or hash does not match. An edited row
// breaks at its own sequence (its hash), a deleted row at its sequence (the
// gap), and rows whose seq values were swapped at the lower of the two (the
// link to the previous hash).
func (l *Log) Verify(ctx context.Context) (VerifyResult, error) {
	const batch = 2000
	var res VerifyResult
	var c chain
	// After retention the chain starts at its checkpoint: the removed
	// events' archives prove what came before.
	cp, ok, err := l.LatestCheckpoint(ctx)
	if err != nil {
		return res, err
	}
	if ok {
		c.seq, c.hash = cp.ThroughSeq, cp.ThroughHash
		res.StartSeq, res.StartPrevHash = cp.ThroughSeq+1, cp.ThroughHash
	}
	for {
		var rows []row
		if err := l.db.WithContext(ctx).Table(l.table).Where("seq > ?", c.seq).Order("seq").Limit(batch).Find(&rows).Error; err != nil {
			return res, fmt.Errorf("read audit events: %w", err)
		}
		for _, r := range rows {
			if !c.add(&res, fromRow(r)) {
				return res, nil
			}
		}
		if len(rows) < batch {
			res.OK = true
			return res, nil
		}
	}
}

// chain checks events one after another: each must carry the sequence
// number after the last one's, link to its hash, and match its own hash.
type chain struct {
	seq  int64  // the last event's sequence number
	hash string // and its hash
	// loose takes the first event's sequence number and previous hash as
	// given (a file of events that starts where an earlier one left off).
	loose bool
}

// add checks e against the chain so far and counts it into res. On a
// mismatch it marks res broken where the chain breaks and reports false.
func (c *chain) add(res *VerifyResult, e Event) bool {
	if c.loose {
		c.loose = false
	} else {
		switch {
		case e.Seq != c.seq+1:
			*res = broken(*res, c.seq+1, fmt.Sprintf("sequence %d is missing (next present is %d)", c.seq+1, e.Seq))
			return false
		case e.PrevHash != c.hash:
			*res = broken(*res, e.Seq, "previous-hash link does not match the event before it")
			return false
		}
	}
	if Hash(e) != e.Hash {
		*res = broken(*res, e.Seq, "event content does not match its hash")
		return false
	}
	c.seq, c.hash = e.Seq, e.Hash
	res.Checked++
	res.HeadSeq, res.HeadHash = e.Seq, e.Hash
	return true
}

func broken(res VerifyResult, at int64, reason string) VerifyResult {
	res.OK, res.BrokenAt, res.Reason = false, at, reason
	return res
}
