package audit

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// Export formats.
const (
	FormatJSONL = "jsonl"
	FormatCSV   = "csv"
)

// exportBatch is how many rows one keyset step reads; memory stays bounded
// by it whatever the size of the log.
const exportBatch = 1000

// CSVHeader is the first row of a CSV export; details is the event's JSON.
var CSVHeader = []string{"seq", "time", "actor_type", "actor_id", "actor_name", "source_ip", "user_agent",
	"action", "target_type", "target_id", "target_name", "decision", "details", "prev_hash", "hash"}

// ErrExportIncomplete is wrapped by the error of an export that failed
// after rows were written. The stream then ends with an error marker (see
// Export), so a reader can tell a cut-short export from a complete one.
var ErrExportIncomplete = errors.New("audit export incomplete")

// ExportErrorMarker starts the last line (JSONL: the key, CSV: the first
// cell) of an export that failed midway.
const ExportErrorMarker = "#export_error"

// ExportHeader is the key of a JSONL export's first line when its filter
// leaves gaps (Filter.LeavesGaps): {"#export":{"filtered":true,"query":…,
// "note":…}}. Such a file's chain cannot be verified; VerifyJSONL says so.
const ExportHeader = "#export"

// filteredNote is the header's note, and what verifying such a file says.
const filteredNote = "filtered export: the chain cannot be checked from it; export unfiltered"

// Export writes the events matching f to w in seq order, oldest first, as
// JSONL (one Event per line) or CSV (CSVHeader, then one row per event).
// It reads in keyset batches and stops at the newest event present when it
// started, so a busy log neither grows the export without end nor is ever
// held in memory. Nothing reaches w before the first batch was read, so a
// failure at the start leaves w untouched (the caller can still answer with
// an error status). A failure after rows were written ends the stream
// with a marker line — JSONL {"#export_error":{"message":...,"after_seq":N}},
// CSV a row "#export_error",message,after_seq — and returns an error
// wrapping ErrExportIncomplete.
func (l *Log) Export(ctx context.Context, f Filter, w io.Writer, format string) error {
	var write func(Event) error
	var flush func() error
	var marker func(msg string, after int64) error
	switch format {
	case FormatJSONL:
		bw := bufio.NewWriter(w)
		enc := json.NewEncoder(bw)
		enc.SetEscapeHTML(false)
		write = func(e Event) error { return enc.Encode(e) }
		flush = bw.Flush
		marker = func(msg string, after int64) error {
			return enc.Encode(map[string]any{ExportErrorMarker: map[string]any{"message": msg, "after_seq": after}})
		}
		if f.LeavesGaps() {
			// Buffered: it reaches w with the first batch, as rows do.
			if err := enc.Encode(map[string]any{ExportHeader: exportLabel{Filtered: true, Query: f.Query, Note: filteredNote}}); err != nil {
				return fmt.Errorf("write export: %w", err)
			}
		}
	case FormatCSV:
		// csv.Writer buffers: the header reaches w with the first batch.
		cw := csv.NewWriter(w)
		if err := cw.Write(CSVHeader); err != nil {
			return fmt.Errorf("write export: %w", err)
		}
		write = func(e Event) error { return cw.Write(csvRecord(e)) }
		flush = func() error { cw.Flush(); return cw.Error() }
		marker = func(msg string, after int64) error {
			return cw.Write([]string{ExportErrorMarker, msg, strconv.FormatInt(after, 10)})
		}
	default:
		v := apperr.Validation()
		v.Add("format", "Unknown export format %q; use jsonl or csv.", format)
		return v
	}
	started := false
	after := int64(0)
	fail := func(err error) error {
		if !started {
			return err
		}
		if merr := marker("The export stopped early: the audit log could not be read; events after after_seq are missing. Export again.", after); merr == nil {
			_ = flush()
		}
		return fmt.Errorf("%w after seq %d: %w", ErrExportIncomplete, after, err)
	}
	head, err := l.head(ctx)
	if err != nil {
		return err
	}
	for head > 0 {
		evs, err := l.page(ctx, f, page{asc: true, after: after, upto: head, limit: exportBatch})
		if err != nil {
			return fail(err)
		}
		for _, e := range evs {
			if err := write(e); err != nil {
				return fmt.Errorf("write export: %w", err)
			}
		}
		if err := flush(); err != nil {
			return fmt.Errorf("write export: %w", err)
		}
		started = true
		if len(evs) < exportBatch {
			break
		}
		after = evs[len(evs)-1].Seq
	}
	return flush()
}

// exportLabel is the body of a filtered JSONL export's header line.
type exportLabel struct {
	Filtered bool   `json:"filtered"`
	Query    string `json:"query"`
	Note     string `json:"note"`
}

// head is the highest seq present (0 for an empty log).
func (l *Log) head(ctx context.Context) (int64, error) {
	var seq *int64
	if err := l.db.WithContext(ctx).Table(l.table).Select("MAX(seq)").Scan(&seq).Error; err != nil {
		return 0, fmt.Errorf("read audit head: %w", err)
	}
	if seq == nil {
		return 0, nil
	}
	return *seq, nil
}

func csvRecord(e Event) []string {
	details := string(e.Details)
	if details == "" {
		details = "{}"
	}
	rec := []string{strconv.FormatInt(e.Seq, 10), e.Time.UTC().Format(time.RFC3339Nano),
		e.Actor.Type, e.Actor.ID, e.Actor.Name, e.SourceIP, e.UserAgent,
		e.Action, e.Target.Type, e.Target.ID, e.Target.Name, e.Decision, details, e.PrevHash, e.Hash}
	for i, s := range rec {
		rec[i] = csvSafe(s)
	}
	return rec
}

// csvSafe keeps a spreadsheet from reading a cell as a formula: cells an
// attacker controls (names, user agents, details) that begin with a formula
// character get a leading single quote. Tab and carriage return are
// included because some spreadsheets strip them before evaluating.
func csvSafe(s string) string {
	if s == "" {
		return s
	}
	switch s[0] {
	case '=', '+', '-', '@', '\t', '\r':
		return "'" + s
	}
	return s
}
