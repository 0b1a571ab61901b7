package recordings

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// textCursor is how far a command's output is indexed for search, kept on
// the command's row (commands.text_cursor, JSON) so each batch of output
// extends the index without reading it: the row is read and locked for the
// batch already. It carries what spans batches: the escape stripper's
// state (an escape split between two batches is still removed whole) and
// an incomplete UTF-8 character at the end of the last batch (its rest
// comes with the next). The text itself is appended as is, so a word split
// between batches is one word in the index.
type textCursor struct {
	// Seq is the last output chunk indexed.
	Seq uint64 `json:"seq"`
	// Len is the indexed text's length in bytes; Raw the recorded output
	// read for it.
	Len int   `json:"len"`
	Raw int64 `json:"raw"`
	// MS is the moment (ms from the start) of the last entry of the
	// moments map, Times the map's length.
	MS    int64 `json:"ms"`
	Times int   `json:"times"`
	// State and CR are the Stripper's state after the last chunk.
	State stripState `json:"st,omitempty"`
	CR    bool       `json:"cr,omitempty"`
	// Tail is an incomplete UTF-8 character held back.
	Tail []byte `json:"tail,omitempty"`
	// Written says the command has its search entry; At is when it was
	// last written (Unix ms, by the recording's clock).
	Written bool  `json:"w,omitempty"`
	At      int64 `json:"at,omitempty"`
	// Capped says the text reached IndexCap (or the output indexRawCap):
	// nothing more is indexed.
	Capped bool `json:"capped,omitempty"`
}

func readCursor(c Command) textCursor {
	cur := textCursor{MS: -momentStep}
	if c.TextCursor != "" {
		_ = json.Unmarshal([]byte(c.TextCursor), &cur) // written by us; a bad one starts over
	}
	return cur
}

func (cur textCursor) encode() string {
	b, _ := json.Marshal(cur) // plain fields: cannot fail
	return string(b)
}

// textBatch turns chunks of output into search text, from a cursor.
type textBatch struct {
	c    Command
	cur  textCursor
	body []byte // text added by this batch
	// times are the moments map's entries added by this batch.
	times []byte
}

func newTextBatch(c Command) *textBatch { return &textBatch{c: c, cur: readCursor(c)} }

// add indexes one chunk; chunks at or below the cursor are skipped. It
// reports false once the index is capped.
func (b *textBatch) add(ch Chunk) bool {
	if b.cur.Capped {
		return false
	}
	if ch.Seq <= b.cur.Seq {
		return true
	}
	b.cur.Seq = ch.Seq
	if ch.Stream == StreamGap {
		return true
	}
	if b.cur.Raw += int64(len(ch.Data)); b.cur.Raw > indexRawCap {
		b.cur.Capped = true
		return false
	}
	off := b.cur.Len + len(b.body)
	var text []byte
	if ch.Stream == StreamExec {
		// agentd's exec records are indexed as "$ argv" lines, apart
		// from the terminal's escape state.
		text = ValidUTF8(execText(nil, ch.Data))
	} else {
		s := Stripper{state: b.cur.State, lastCR: b.cur.CR}
		text = s.Append(append([]byte(nil), b.cur.Tail...), ch.Data)
		b.cur.State, b.cur.CR = s.state, s.lastCR
		n := completeUTF8(text)
		b.cur.Tail = append(b.cur.Tail[:0], text[n:]...)
		text = ValidUTF8(text[:n])
	}
	if ms := sinceStart(b.c, ch.At); len(text) > 0 && ms >= b.cur.MS+momentStep && b.cur.Times < momentsLimit {
		before := len(b.times)
		b.times = append(strconv.AppendInt(append(strconv.AppendInt(b.times, int64(off), 10), ':'), ms, 10), ' ')
		b.cur.Times += len(b.times) - before
		b.cur.MS = ms
	}
	if off+len(text) > IndexCap {
		text = cutRunes(text, IndexCap-off)
		b.cur.Capped, b.cur.Tail = true, nil
	}
	b.body = append(b.body, text...)
	return !b.cur.Capped
}

// end flushes what is held back at the command's end: an incomplete
// character becomes '?'.
func (b *textBatch) end() {
	if len(b.cur.Tail) > 0 && !b.cur.Capped && b.cur.Len+len(b.body)+len(b.cur.Tail) <= IndexCap {
		b.body = append(b.body, ValidUTF8(b.cur.Tail)...)
	}
	b.cur.Tail = nil
}

// write appends the batch's text to the command's search entry (creating
// it), in one statement, and moves the cursor on c and in updates (the
// command row's update of the same transaction). A batch that added
// nothing to the text writes nothing but the cursor.
func (b *textBatch) write(ctx context.Context, tx *gorm.DB, c *Command, updates map[string]any) error {
	e := b.entry(c, updates)
	if e == nil {
		return nil
	}
	err := tx.WithContext(ctx).Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "command_id"}}, DoUpdates: clause.Set{
		{Column: clause.Column{Name: "body"}, Value: gorm.Expr("recording_text.body || excluded.body")},
		{Column: clause.Column{Name: "times"}, Value: gorm.Expr("recording_text.times || excluded.times")},
		{Column: clause.Column{Name: "capped"}, Value: gorm.Expr("excluded.capped")},
	}}).Create(e).Error
	if err != nil {
		return fmt.Errorf("index command %d: %w", c.ID, err)
	}
	return nil
}

// entry is what write stores: the batch's addition to the search entry
// (nil when it added nothing and the entry exists), with the cursor moved
// on c and in updates as if it were written. The caller writes it in the
// transaction that applies updates, or the cursor lies.
func (b *textBatch) entry(c *Command, updates map[string]any) *textEntry {
	var e *textEntry
	if len(b.body) > 0 || len(b.times) > 0 || !b.cur.Written || b.cur.Capped {
		b.cur.Len += len(b.body)
		e = &textEntry{CommandID: c.ID, Command: string(ValidUTF8([]byte(c.Command))), Body: string(b.body), Times: string(b.times), Capped: b.cur.Capped}
		b.cur.Written = true
	}
	c.TextCursor = b.cur.encode()
	updates["text_cursor"] = c.TextCursor
	return e
}

// textUpsertPg is write's statement on Postgres, for writers that send it
// themselves in a pipelined batch.
const textUpsertPg = `INSERT INTO recording_text (command_id, command, body, times, capped) VALUES ($1, $2, $3, $4, $5)
	ON CONFLICT (command_id) DO UPDATE SET body = recording_text.body || excluded.body,
	times = recording_text.times || excluded.times, capped = excluded.capped`

// IndexEvery is how often at most a running command's search entry is
// written. Each write makes the database tokenize the entry again (up to
// IndexCap: a few milliseconds on SQLite, tens on Postgres, see
// BenchmarkLiveIndexBatch), so a command printing many small batches would
// otherwise spend its follower's time re-indexing. Batches within it wait
// in the recording and are indexed with the next write; a follower whose
// index lags polls agentd at least this often (IndexLags), so the last
// batch before a quiet spell is searchable within about two of these.
const IndexEvery = time.Second

// IndexLags reports whether c has stored output its search entry does not
// hold yet (its follower should come back within IndexEvery to index it).
func IndexLags(c Command) bool {
	cur := readCursor(c)
	return !cur.Capped && cur.Seq < uint64(c.LastChunk)
}

// indexOutputTx indexes a batch of output just stored for c (chunks, none
// for a poll that brought nothing), inside the transaction that stored it
// (c is locked), unless the entry was written less than IndexEvery before
// now: then the batch waits in the recording for the next write. Output
// recorded after the cursor (batches that waited, or a command running
// across the upgrade that brought live search) is read from the recording
// first.
func indexOutputTx(ctx context.Context, tx *gorm.DB, c *Command, prevLast int64, chunks []Chunk, now time.Time, updates map[string]any) error {
	b, err := planIndexOutput(*c, prevLast, chunks, now, func(b *textBatch, upTo uint64) error { return b.catchUp(ctx, tx, upTo) })
	if err != nil || b == nil {
		return err
	}
	return b.write(ctx, tx, c, updates)
}

// planIndexOutput is indexOutputTx's batch of text (nil when the entry is
// not due), reading recorded output it lags behind with catchUp.
func planIndexOutput(c Command, prevLast int64, chunks []Chunk, now time.Time, catchUp func(b *textBatch, upTo uint64) error) (*textBatch, error) {
	if !indexDue(c, prevLast, chunks, now) {
		return nil, nil
	}
	b := newTextBatch(c)
	b.cur.At = now.UnixMilli()
	if b.cur.Seq < uint64(prevLast) {
		if err := catchUp(b, uint64(prevLast)); err != nil {
			return nil, err
		}
	}
	for _, ch := range chunks {
		if !b.add(ch) {
			break
		}
	}
	return b, nil
}

// indexDue says whether storing chunks after c (whose recording ended at
// prevLast) writes its search entry now: something is left to index, and
// the last write is IndexEvery old.
func indexDue(c Command, prevLast int64, chunks []Chunk, now time.Time) bool {
	cur := readCursor(c)
	if cur.Capped || len(chunks) == 0 && cur.Seq >= uint64(prevLast) {
		return false
	}
	return !cur.Written || now.UnixMilli()-cur.At >= IndexEvery.Milliseconds()
}

// indexTime is when a batch of chunks is indexed: its last chunk's time,
// or now for a batch that brought nothing.
func indexTime(chunks []Chunk) time.Time {
	if len(chunks) > 0 {
		return chunks[len(chunks)-1].At
	}
	return time.Now()
}

// catchUp indexes the recorded chunks after the cursor up to upTo.
func (b *textBatch) catchUp(ctx context.Context, tx *gorm.DB, upTo uint64) error {
	err := eachFrame(ctx, tx, b.c.ID, KindOut, int64(b.cur.Seq), func(_ frame, cs []Chunk) error {
		for _, ch := range cs {
			if ch.Seq > upTo || !b.add(ch) {
				return errStop
			}
		}
		return nil
	})
	// A recording that cannot be decoded is indexed as far as it can be
	// read; verification reports the damage.
	if err != nil && !errors.Is(err, errCorrupt) {
		return fmt.Errorf("index command %d: %w", b.c.ID, err)
	}
	return nil
}

// indexEndTx completes command c's search entry inside the transaction
// recording its end: whatever output the batches did not index yet (none,
// normally), the character held back, and an entry for a command that
// printed nothing (its command line is searchable too).
func indexEndTx(ctx context.Context, tx *gorm.DB, c *Command, updates map[string]any) error {
	b, err := planIndexEnd(*c, func(b *textBatch, upTo uint64) error { return b.catchUp(ctx, tx, upTo) })
	if err != nil {
		return err
	}
	return b.write(ctx, tx, c, updates)
}

// planIndexEnd is indexEndTx's batch of text, reading recorded output the
// entry lags behind with catchUp.
func planIndexEnd(c Command, catchUp func(b *textBatch, upTo uint64) error) (*textBatch, error) {
	b := newTextBatch(c)
	if !b.cur.Capped && b.cur.Seq < uint64(c.LastChunk) {
		if err := catchUp(b, uint64(c.LastChunk)); err != nil {
			return nil, err
		}
	}
	b.end()
	return b, nil
}
