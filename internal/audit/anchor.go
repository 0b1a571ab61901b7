package audit

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// Anchor is a position of the chain recorded outside the log's database
// (a signed checkpoint in the catalog, see internal/anchor). The chain on
// its own proves that no stored event was edited or removed from its
// middle, but not that its newest events were cut off, nor that an older
// copy of its database was restored: the rest still links. An anchor
// does: the log must still hold the event at Seq, and it must have Hash.
type Anchor struct {
	Seq     int64     `json:"seq"`
	Hash    string    `json:"hash"`
	TakenAt time.Time `json:"taken_at"`
}

// AnchorCheck is how the stored chain compares with its anchors.
type AnchorCheck struct {
	// Anchor is the newest anchor, the one the log must reach.
	Anchor Anchor `json:"anchor"`
	OK     bool   `json:"ok"`
	// HeadSeq and HeadHash are the newest stored event (0 and "" when
	// the log holds none).
	HeadSeq  int64  `json:"head_seq"`
	HeadHash string `json:"head_hash"`
	// MissingFrom and MissingThrough are the events the anchors prove
	// were written and the log no longer holds as written: a cut tail,
	// or the events an older copy of the database lacks or replaced.
	MissingFrom    int64 `json:"missing_from,omitempty"`
	MissingThrough int64 `json:"missing_through,omitempty"`
	// Retained is set when retention removed the newest anchored event
	// the log reaches and no retention checkpoint ends at it: it lies
	// inside an archive, which proves it on its own, and counts as held
	// (see holds).
	Retained bool   `json:"retained,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// Head is the newest stored event; ok is false for an empty log.
func (l *Log) Head(ctx context.Context) (e Event, ok bool, err error) {
	var rows []row
	if err := l.db.WithContext(ctx).Table(l.table).Order("seq DESC").Limit(1).Find(&rows).Error; err != nil {
		return Event{}, false, fmt.Errorf("read audit head: %w", err)
	}
	if len(rows) == 0 {
		return Event{}, false, nil
	}
	return fromRow(rows[0]), true, nil
}

// CheckAnchors compares the stored chain with anchors (any order; the
// newest is the one the log must reach). Read the anchors before calling
// it: the head is read here, after them, so an anchor taken meanwhile
// cannot look ahead of the log.
//
// The log must reach the newest anchor's sequence number, and the newest
// anchor it reaches must match: the stored event at its sequence has its
// hash. Since each hash covers every event before it, one matching
// anchor vouches for all earlier ones. When it does not match, the
// anchors are searched for the newest one that still does, which bounds
// where the stored chain diverged from the one anchored.
func (l *Log) CheckAnchors(ctx context.Context, anchors []Anchor) (AnchorCheck, error) {
	var ac AnchorCheck
	if len(anchors) == 0 {
		return ac, fmt.Errorf("no anchor to check against")
	}
	as := append([]Anchor(nil), anchors...)
	sort.Slice(as, func(i, j int) bool { return as[i].Seq < as[j].Seq })
	newest := as[len(as)-1]
	ac.Anchor = newest
	head, ok, err := l.Head(ctx)
	if err != nil {
		return ac, err
	}
	if ok {
		ac.HeadSeq, ac.HeadHash = head.Seq, head.Hash
	} else if l.hasRetention() {
		// Retention never removes the head, but a log emptied anyway
		// still ends where it removed events.
		cp, ok, err := latestCheckpoint(l.db.WithContext(ctx))
		if err != nil {
			return ac, err
		}
		if ok {
			ac.HeadSeq, ac.HeadHash = cp.ThroughSeq, cp.ThroughHash
		}
	}
	// The newest anchor the log reaches.
	k := sort.Search(len(as), func(i int) bool { return as[i].Seq > ac.HeadSeq }) - 1
	var reached holding
	if k >= 0 {
		if reached, err = l.holds(ctx, as[k]); err != nil {
			return ac, err
		}
	}
	if k < 0 || reached.matches() {
		ac.Retained = k >= 0 && reached.retained
		if newest.Seq <= ac.HeadSeq {
			ac.OK = true
			return ac, nil
		}
		ac.MissingFrom, ac.MissingThrough = ac.HeadSeq+1, newest.Seq
		ac.Reason = fmt.Sprintf("%s: the checkpoint of %s recorded event %d with hash %s; %s",
			missing(ac.MissingFrom, ac.MissingThrough), stamp(newest.TakenAt), newest.Seq, newest.Hash, logEnd(ac.HeadSeq))
		return ac, nil
	}
	// The anchor the log reaches does not match: find the newest that
	// does (matching is monotone along a linked chain).
	j := sort.Search(k, func(i int) bool {
		h, herr := l.holds(ctx, as[i])
		if herr != nil {
			err = herr
			return true
		}
		return !h.matches()
	}) - 1
	if err != nil {
		return ac, err
	}
	firstBad := as[j+1]
	ac.MissingFrom, ac.MissingThrough = 1, newest.Seq
	since := "from the start of the chain"
	if j >= 0 {
		ac.MissingFrom = as[j].Seq + 1
		since = fmt.Sprintf("after event %d (the newest checkpoint it still matches, of %s)", as[j].Seq, stamp(as[j].TakenAt))
	}
	ac.Reason = fmt.Sprintf("the log no longer holds %s as checkpointed: the checkpoint of %s recorded event %d with hash %s, and the log's event %d %s; "+
		"the log diverges %s, at or before event %d, as when an older copy of the database is restored and written to since; %s",
		eventRange(ac.MissingFrom, ac.MissingThrough), stamp(as[k].TakenAt), as[k].Seq, as[k].Hash, as[k].Seq, reached.describe(),
		since, firstBad.Seq, logEnd(ac.HeadSeq))
	return ac, nil
}

// holding is what the log holds at an anchored sequence number.
type holding struct {
	found    bool   // the event is stored
	hash     string // its hash (or the retention checkpoint's)
	want     string // the anchor's hash
	retained bool   // retention removed it; see holds
}

func (h holding) matches() bool { return h.retained || (h.found && h.hash == h.want) }

func (h holding) describe() string {
	if !h.found {
		return "is missing"
	}
	return "has hash " + h.hash
}

// holds looks up the event at a's sequence number. One that retention
// removed is compared with the retention checkpoint of that sequence
// number when there is one; otherwise it lies inside an archive, which
// proves it on its own (console audit verify --file), and counts as held.
func (l *Log) holds(ctx context.Context, a Anchor) (holding, error) {
	h := holding{want: a.Hash}
	db := l.db.WithContext(ctx)
	var rows []row
	if err := db.Table(l.table).Where("seq = ?", a.Seq).Limit(1).Find(&rows).Error; err != nil {
		return h, fmt.Errorf("read audit event %d: %w", a.Seq, err)
	}
	if len(rows) > 0 {
		h.found, h.hash = true, rows[0].Hash
		return h, nil
	}
	if !l.hasRetention() {
		return h, nil
	}
	cp, ok, err := latestCheckpoint(db)
	if err != nil || !ok || a.Seq > cp.ThroughSeq {
		return h, err
	}
	var cps []Checkpoint
	if err := db.Table(CheckpointTable).Where("through_seq = ?", a.Seq).Limit(1).Find(&cps).Error; err != nil {
		return h, fmt.Errorf("read audit checkpoint: %w", err)
	}
	if len(cps) > 0 {
		h.found, h.hash = true, cps[0].ThroughHash
		return h, nil
	}
	h.retained = true
	return h, nil
}

// WithAnchor folds an anchor check into a verification: a chain that
// links but does not hold what its anchors recorded fails, at the first
// sequence number missing. A chain already broken keeps its break and
// gains the anchor's reason.
func (r VerifyResult) WithAnchor(ac AnchorCheck) VerifyResult {
	r.Anchor = &ac
	if ac.OK {
		return r
	}
	if !r.OK {
		r.Reason += "; also, " + ac.Reason
		return r
	}
	return broken(r, ac.MissingFrom, ac.Reason)
}

// CheckAnchorInFile compares a verified file of events (an unfiltered
// export, see VerifyJSONL) with an anchor: the file must reach the
// anchored event and hold it with its hash. at is the hash the file's
// event at a.Seq has ("" when the file does not hold it).
func CheckAnchorInFile(res VerifyResult, a Anchor, at string) AnchorCheck {
	ac := AnchorCheck{Anchor: a, HeadSeq: res.HeadSeq, HeadHash: res.HeadHash}
	switch {
	case res.Checked == 0:
		ac.Reason = "the file holds no events to compare with the checkpoint"
	case a.Seq < res.StartSeq:
		ac.Reason = fmt.Sprintf("the file starts at event %d, after the checkpoint's event %d: it cannot be compared with this checkpoint; use a newer checkpoint, or verify the archives before it with their own checkpoint", res.StartSeq, a.Seq)
	case a.Seq > res.HeadSeq:
		ac.MissingFrom, ac.MissingThrough = res.HeadSeq+1, a.Seq
		ac.Reason = fmt.Sprintf("%s: the checkpoint of %s recorded event %d with hash %s; the file ends at %d",
			missing(ac.MissingFrom, ac.MissingThrough), stamp(a.TakenAt), a.Seq, a.Hash, res.HeadSeq)
	case at != a.Hash:
		ac.MissingFrom, ac.MissingThrough = res.StartSeq, a.Seq
		ac.Reason = fmt.Sprintf("event %d in the file has hash %s, but the checkpoint of %s recorded %s: the file's events up to %d are not the ones checkpointed",
			a.Seq, at, stamp(a.TakenAt), a.Hash, a.Seq)
	default:
		ac.OK = true
	}
	return ac
}

func eventRange(from, through int64) string {
	if from == through {
		return fmt.Sprintf("event %d", from)
	}
	return fmt.Sprintf("events %d–%d", from, through)
}

// missing says that the events from..through are missing.
func missing(from, through int64) string {
	if from == through {
		return eventRange(from, through) + " is missing"
	}
	return eventRange(from, through) + " are missing"
}

func logEnd(head int64) string {
	if head == 0 {
		return "the log holds no events"
	}
	return fmt.Sprintf("the log ends at %d", head)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
