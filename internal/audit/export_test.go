package audit_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

func TestExport(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		l, _ := newLog(t, d)
		ctx := context.Background()
		// More than one export batch (1000), so keyset batching is exercised.
		all := seedVaried(t, l, 1050)
		hostile := mustAppend(t, l, audit.Event{
			Actor:  audit.Actor{Type: audit.ActorUser, ID: "u-evil", Name: "=HYPERLINK(\"http://x\")"},
			Action: "agent.exec", Target: audit.Target{Type: "agent", ID: "+1", Name: "-2, \"quoted\"\nline"},
			UserAgent: "@SUM(A1)", Details: audit.Details(map[string]string{"command": "=cmd|' /C calc'!A0"}),
		})
		all = append(all, hostile)
		f := audit.Filter{Action: "agent."}
		var want []audit.Event
		for _, e := range all {
			if matches(f, e) {
				want = append(want, e)
			}
		}

		t.Run("jsonl", func(t *testing.T) {
			var buf bytes.Buffer
			if err := l.Export(ctx, f, &buf, audit.FormatJSONL); err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(&buf)
			// A filter that leaves gaps labels the file first.
			if !sc.Scan() || !strings.HasPrefix(sc.Text(), `{"#export":{"filtered":true`) {
				t.Fatalf("first line %q; want the filtered export's header", sc.Text())
			}
			var got []audit.Event
			for sc.Scan() {
				var e audit.Event
				if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
					t.Fatalf("line %d: %v", len(got)+1, err)
				}
				got = append(got, e)
			}
			if len(got) != len(want) {
				t.Fatalf("got %d lines, want %d", len(got), len(want))
			}
			for i := range got {
				g, w := got[i], want[i]
				if g.Seq != w.Seq || g.Hash != w.Hash || g.Actor != w.Actor || !g.Time.Equal(w.Time) || string(g.Details) != string(w.Details) {
					t.Fatalf("line %d:\n got  %+v\n want %+v", i+1, g, w)
				}
				// Exported events can be re-verified offline.
				if audit.Hash(g) != g.Hash {
					t.Fatalf("line %d does not hash to its hash", i+1)
				}
			}
		})

		t.Run("csv", func(t *testing.T) {
			var buf bytes.Buffer
			if err := l.Export(ctx, f, &buf, audit.FormatCSV); err != nil {
				t.Fatal(err)
			}
			recs, err := csv.NewReader(&buf).ReadAll()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(recs[0], audit.CSVHeader) {
				t.Fatalf("header = %v", recs[0])
			}
			recs = recs[1:]
			if len(recs) != len(want) {
				t.Fatalf("got %d rows, want %d", len(recs), len(want))
			}
			col := map[string]int{}
			for i, h := range audit.CSVHeader {
				col[h] = i
			}
			for i, r := range recs {
				w := want[i]
				if r[col["seq"]] != strconv.FormatInt(w.Seq, 10) || r[col["hash"]] != w.Hash {
					t.Fatalf("row %d seq/hash = %s/%s, want %d/%s", i+1, r[col["seq"]], r[col["hash"]], w.Seq, w.Hash)
				}
				if tm, err := time.Parse(time.RFC3339Nano, r[col["time"]]); err != nil || !tm.Equal(w.Time) {
					t.Fatalf("row %d time = %s, want %s", i+1, r[col["time"]], w.Time)
				}
				if w.Seq == hostile.Seq {
					continue
				}
				var details map[string]any
				if err := json.Unmarshal([]byte(r[col["details"]]), &details); err != nil {
					t.Fatalf("row %d details are not JSON: %v", i+1, err)
				}
				if r[col["actor_name"]] != w.Actor.Name {
					t.Fatalf("row %d actor_name = %q", i+1, r[col["actor_name"]])
				}
			}
			last := recs[len(recs)-1]
			for name, wantCell := range map[string]string{
				"actor_name":  "'=HYPERLINK(\"http://x\")",
				"target_id":   "'+1",
				"target_name": "'-2, \"quoted\"\nline",
				"user_agent":  "'@SUM(A1)",
				"details":     `{"command":"=cmd|' /C calc'!A0"}`, // JSON object: starts with {, harmless
			} {
				if last[col[name]] != wantCell {
					t.Errorf("hostile %s = %q, want %q", name, last[col[name]], wantCell)
				}
			}
		})

		t.Run("empty", func(t *testing.T) {
			var buf bytes.Buffer
			if err := l.Export(ctx, audit.Filter{Actor: "nobody"}, &buf, audit.FormatCSV); err != nil {
				t.Fatal(err)
			}
			recs, err := csv.NewReader(&buf).ReadAll()
			if err != nil || len(recs) != 1 {
				t.Fatalf("empty export = %v, %v; want only the header", recs, err)
			}
		})

		t.Run("unknown format", func(t *testing.T) {
			err := l.Export(ctx, audit.Filter{}, &bytes.Buffer{}, "xml")
			var ve *apperr.ValidationError
			if !errors.As(err, &ve) || ve.Fields["format"] == "" {
				t.Fatalf("Export(xml) = %v, want a validation error on format", err)
			}
		})
	})
}

// TestFilteredExportsSayTheyCannotBeVerified: an export of a filter that
// leaves gaps starts with a header saying so, and verifying it reports a
// filtered export rather than a broken chain; an unfiltered export, or one
// of a time range, has no header and verifies.
func TestFilteredExportsSayTheyCannotBeVerified(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		l, _ := newLog(t, d)
		ctx := context.Background()
		seedVaried(t, l, 40)
		export := func(q string) []byte {
			f, err := audit.ParseQuery(q)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := l.Export(ctx, f, &buf, audit.FormatJSONL); err != nil {
				t.Fatal(err)
			}
			return buf.Bytes()
		}
		for _, q := range []string{"", "from:2000-01-01 to:2999-12-31"} {
			res, err := audit.VerifyJSONL(bytes.NewReader(export(q)))
			if err != nil || !res.OK || res.Filtered {
				t.Errorf("export of %q: %+v, %v; want it verified", q, res, err)
			}
		}
		res, err := audit.VerifyJSONL(bytes.NewReader(export("action:agent.")))
		if err != nil || res.OK || !res.Filtered || res.BrokenAt != 0 ||
			!strings.Contains(res.Reason, "filtered export: the chain cannot be checked from it; export unfiltered") || !strings.Contains(res.Reason, `"action:agent."`) {
			t.Errorf("filtered export: %+v, %v", res, err)
		}
	})
}
