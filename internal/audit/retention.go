package audit

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/store"
)

// Retention tables of an org database (migrations/org/0010_retention).
// The platform log has no retention: its tables do not exist there.
const (
	CheckpointTable = "audit_checkpoints"
	ArchiveTable    = "audit_archives"
)

// Checkpoint is where the stored chain starts after retention removed its
// beginning: the last removed event's seq and hash.
type Checkpoint struct {
	ID          int64     `gorm:"column:id;primaryKey" json:"id"`
	ThroughSeq  int64     `gorm:"column:through_seq" json:"through_seq"`
	ThroughHash string    `gorm:"column:through_hash" json:"through_hash"`
	CreatedAt   time.Time `gorm:"column:created_at" json:"created_at"`
}

// Archive is one batch of removed events, kept as gzip JSONL (one Event a
// line, with seq, prev_hash and hash) for the admin to download; it
// verifies on its own with VerifyJSONL.
type Archive struct {
	ID            int64     `gorm:"column:id;primaryKey" json:"id"`
	CreatedAt     time.Time `gorm:"column:created_at" json:"created_at"`
	FirstSeq      int64     `gorm:"column:first_seq" json:"first_seq"`
	LastSeq       int64     `gorm:"column:last_seq" json:"last_seq"`
	FirstPrevHash string    `gorm:"column:first_prev_hash" json:"first_prev_hash"`
	LastHash      string    `gorm:"column:last_hash" json:"last_hash"`
	Events        int64     `gorm:"column:events" json:"events"`
	Body          []byte    `gorm:"column:body" json:"-"`
}

// hasRetention reports whether this log's database keeps checkpoints.
func (l *Log) hasRetention() bool { return l.table == OrgTable }

// LatestCheckpoint returns the newest checkpoint, if retention ever ran.
func (l *Log) LatestCheckpoint(ctx context.Context) (Checkpoint, bool, error) {
	if !l.hasRetention() {
		return Checkpoint{}, false, nil
	}
	return latestCheckpoint(l.db.WithContext(ctx))
}

func latestCheckpoint(db *gorm.DB) (Checkpoint, bool, error) {
	var cps []Checkpoint
	if err := db.Table(CheckpointTable).Order("through_seq DESC").Limit(1).Find(&cps).Error; err != nil {
		return Checkpoint{}, false, fmt.Errorf("read audit checkpoint: %w", err)
	}
	if len(cps) == 0 {
		return Checkpoint{}, false, nil
	}
	return cps[0], true, nil
}

// ExpireResult says what one Expire call removed.
type ExpireResult struct {
	Removed  int64   `json:"removed"`
	Archives []int64 `json:"archives"`
	// ThroughSeq and ThroughHash are the new checkpoint (zero if nothing
	// was removed).
	ThroughSeq  int64  `json:"through_seq,omitempty"`
	ThroughHash string `json:"through_hash,omitempty"`
}

// expireBatch bounds the events archived and removed per transaction, so
// memory and lock time stay bounded however much has expired.
const expireBatch = 20000

// Expire archives and then removes every event that occurred before cutoff,
// in batches, each batch in one transaction holding the chain lock: archive
// row, new checkpoint, delete. The chain head is never removed (the next
// append links to it), so at least one event always remains. A failure
// leaves the batches done so far complete and consistent.
func (l *Log) Expire(ctx context.Context, cutoff time.Time) (ExpireResult, error) {
	var res ExpireResult
	if !l.hasRetention() {
		return res, errors.New("audit retention applies to org logs only")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		done := false
		err := l.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := lockChain(tx); err != nil {
				return err
			}
			var head row
			if err := tx.Table(l.table).Order("seq DESC").Limit(1).Find(&head).Error; err != nil {
				return fmt.Errorf("read chain head: %w", err)
			}
			var rows []row
			if err := tx.Table(l.table).Where("occurred_at < ? AND seq < ?", cutoff.UTC(), head.Seq).
				Order("seq").Limit(expireBatch).Find(&rows).Error; err != nil {
				return fmt.Errorf("read expired audit events: %w", err)
			}
			if len(rows) == 0 {
				done = true
				return nil
			}
			evs := make([]Event, len(rows))
			for i, r := range rows {
				evs[i] = fromRow(r)
			}
			body, err := gzipJSONL(evs)
			if err != nil {
				return err
			}
			first, last := evs[0], evs[len(evs)-1]
			now := l.now().UTC()
			a := Archive{CreatedAt: now, FirstSeq: first.Seq, LastSeq: last.Seq, FirstPrevHash: first.PrevHash,
				LastHash: last.Hash, Events: int64(len(evs)), Body: body}
			if err := tx.Table(ArchiveTable).Create(&a).Error; err != nil {
				return fmt.Errorf("store audit archive: %w", err)
			}
			cp := Checkpoint{ThroughSeq: last.Seq, ThroughHash: last.Hash, CreatedAt: now}
			if err := tx.Table(CheckpointTable).Create(&cp).Error; err != nil {
				return fmt.Errorf("store audit checkpoint: %w", err)
			}
			if err := tx.Table(l.table).Where("seq <= ?", last.Seq).Delete(&row{}).Error; err != nil {
				return fmt.Errorf("remove expired audit events: %w", err)
			}
			res.Removed += int64(len(evs))
			res.Archives = append(res.Archives, a.ID)
			res.ThroughSeq, res.ThroughHash = last.Seq, last.Hash
			done = len(rows) < expireBatch
			return nil
		})
		if err != nil {
			return res, err
		}
		if done {
			return res, nil
		}
	}
}

// CompactAfter is how many events one retention run must remove before
// it rebuilds the free-text index (Compact).
const CompactAfter = 50_000

// Compact rebuilds the org log's trigram index (Postgres; SQLite has
// none) with REINDEX CONCURRENTLY, which blocks neither reads nor appends.
// After retention removed many events the index keeps the removed rows'
// pages even once vacuumed, and a rare free-text term's first page slows
// by an order of magnitude: 1.6 s instead of 30 ms over the half of a
// million events left (BenchmarkQuery1MAfterRetention).
func (l *Log) Compact(ctx context.Context) error {
	if !l.hasRetention() || store.DialectOfDB(l.db) != store.Postgres {
		return nil
	}
	if err := l.db.WithContext(ctx).Exec("REINDEX INDEX CONCURRENTLY audit_search_trgm").Error; err != nil {
		return fmt.Errorf("rebuild audit search index: %w", err)
	}
	return nil
}

func gzipJSONL(evs []Event) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	enc := json.NewEncoder(zw)
	enc.SetEscapeHTML(false)
	for _, e := range evs {
		if err := enc.Encode(e); err != nil {
			return nil, fmt.Errorf("encode audit archive: %w", err)
		}
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("compress audit archive: %w", err)
	}
	return buf.Bytes(), nil
}

// Archives lists the log's archives, newest first, without their bodies.
func (l *Log) Archives(ctx context.Context) ([]Archive, error) {
	if !l.hasRetention() {
		return []Archive{}, nil
	}
	out := []Archive{}
	err := l.db.WithContext(ctx).Table(ArchiveTable).
		Select("id, created_at, first_seq, last_seq, first_prev_hash, last_hash, events").Order("id DESC").Find(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list audit archives: %w", err)
	}
	return out, nil
}

// ErrNoArchive is returned for an archive id that does not exist.
var ErrNoArchive = errors.New("no such audit archive")

// ArchiveInfo describes archive id, without its body.
func (l *Log) ArchiveInfo(ctx context.Context, id int64) (Archive, error) {
	if !l.hasRetention() {
		return Archive{}, ErrNoArchive
	}
	var as []Archive
	err := l.db.WithContext(ctx).Table(ArchiveTable).
		Select("id, created_at, first_seq, last_seq, first_prev_hash, last_hash, events").Where("id = ?", id).Limit(1).Find(&as).Error
	if err != nil {
		return Archive{}, fmt.Errorf("read audit archive %d: %w", id, err)
	}
	if len(as) == 0 {
		return Archive{}, ErrNoArchive
	}
	return as[0], nil
}

// WriteArchive writes archive id as plain JSONL to w.
func (l *Log) WriteArchive(ctx context.Context, id int64, w io.Writer) (Archive, error) {
	if !l.hasRetention() {
		return Archive{}, ErrNoArchive
	}
	var as []Archive
	if err := l.db.WithContext(ctx).Table(ArchiveTable).Where("id = ?", id).Limit(1).Find(&as).Error; err != nil {
		return Archive{}, fmt.Errorf("read audit archive: %w", err)
	}
	if len(as) == 0 {
		return Archive{}, ErrNoArchive
	}
	zr, err := gzip.NewReader(bytes.NewReader(as[0].Body))
	if err != nil {
		return as[0], fmt.Errorf("open audit archive %d: %w", id, err)
	}
	if _, err := io.Copy(w, zr); err != nil {
		return as[0], fmt.Errorf("write audit archive %d: %w", id, err)
	}
	return as[0], nil
}

// VerifyJSONL verifies a JSONL file of events (an archive or an unfiltered
// export) on its own: consecutive sequence numbers, each event linked to
// the one before it, and each event's content matching its hash. The first
// event's previous hash is taken as given (the archive starts where an
// earlier one, or the chain, left off); StartSeq and StartPrevHash report it
// so it can be matched against the archive before.
func VerifyJSONL(r io.Reader) (VerifyResult, error) {
	res, _, err := verifyJSONL(r, 0)
	return res, err
}

// VerifyJSONLAnchored is VerifyJSONL that also compares the file with an
// anchor (an exported checkpoint): the file must reach the anchored event
// and hold it with the anchored hash, or it fails naming what is missing.
func VerifyJSONLAnchored(r io.Reader, a Anchor) (VerifyResult, error) {
	res, at, err := verifyJSONL(r, a.Seq)
	if err != nil {
		return res, err
	}
	return res.WithAnchor(CheckAnchorInFile(res, a, at)), nil
}

// verifyJSONL verifies a file of events and returns, besides, the hash of
// its event at seq ("" when it holds none).
func verifyJSONL(r io.Reader, seq int64) (VerifyResult, string, error) {
	var res VerifyResult
	var at string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	line := 0
	c := chain{loose: true}
	for sc.Scan() {
		line++
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		if res.Checked == 0 {
			var h map[string]exportLabel
			if json.Unmarshal(sc.Bytes(), &h) == nil && h[ExportHeader].Filtered {
				res.Filtered, res.Reason = true, filteredNote
				if q := h[ExportHeader].Query; q != "" {
					res.Reason += fmt.Sprintf(" (it holds the events matching %q)", q)
				}
				return res, at, nil
			}
		}
		var e Event
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return broken(res, c.seq+1, fmt.Sprintf("line %d is not an audit event: %v", line, err)), at, nil
		}
		if res.Checked == 0 {
			res.StartSeq, res.StartPrevHash = e.Seq, e.PrevHash
		}
		if !c.add(&res, e) {
			return res, at, nil
		}
		if e.Seq == seq {
			at = e.Hash
		}
	}
	if err := sc.Err(); err != nil {
		return res, at, fmt.Errorf("read events: %w", err)
	}
	if res.Checked == 0 {
		return broken(res, 0, "the file holds no audit events"), at, nil
	}
	res.OK = true
	return res, at, nil
}
