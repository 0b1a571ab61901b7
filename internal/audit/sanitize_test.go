package audit_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestHostileTextIsStored: text an attacker controls (a User-Agent with
// invalid UTF-8 or NUL, a 4,000-character e-mail, a 900 KB header) is
// stored cleaned and bounded on both databases, and the chain verifies.
func TestHostileTextIsStored(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		l, _ := newLog(t, d)
		long := strings.Repeat("é", 2000) + "@example.com" // 4,000+ bytes
		cases := []audit.Event{
			{Actor: audit.Actor{Type: audit.ActorAnonymous, Name: "a\xff\xfeb"}, UserAgent: "curl\xff/8", Action: "org.create"},
			{Actor: audit.Actor{Type: audit.ActorAnonymous, Name: "nul\x00name"}, UserAgent: "ua\x00", SourceIP: "1.2.3.4\x00", Action: "user.login",
				Target: audit.Target{Type: "user", ID: "x\x00", Name: "\x00"}, Details: audit.Details(map[string]string{"q": "a\x00b\xff"})},
			{Actor: audit.Actor{Type: audit.ActorAnonymous, Name: long, ID: long}, Target: audit.Target{Type: "user", ID: long, Name: long},
				UserAgent: strings.Repeat("M", 900<<10), Action: "user.login"},
		}
		for i, e := range cases {
			got, err := l.Append(context.Background(), e)
			if err != nil {
				t.Fatalf("case %d: %v", i, err)
			}
			for _, s := range []string{got.Actor.Name, got.Actor.ID, got.Target.ID, got.Target.Name, got.UserAgent, got.SourceIP, got.Action} {
				if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
					t.Errorf("case %d: stored %q", i, s)
				}
			}
			if len(got.Actor.Name) > audit.MaxIndexedText || len(got.Target.ID) > audit.MaxIndexedText || len(got.UserAgent) > audit.MaxUserAgent {
				t.Errorf("case %d: lengths %d/%d/%d exceed the bounds", i, len(got.Actor.Name), len(got.Target.ID), len(got.UserAgent))
			}
		}
		res, err := l.Verify(context.Background())
		if err != nil || !res.OK || res.Checked != int64(len(cases)) {
			t.Fatalf("verify = %+v, %v", res, err)
		}
		// The truncated e-mail is still what a search by actor finds.
		f, err := audit.ParseQuery(`actor:"` + audit.Clean(long, audit.MaxIndexedText) + `"`)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := l.Query(context.Background(), f, 0, 10)
		if err != nil || len(evs) != 1 {
			t.Fatalf("query by the stored name: %d events, %v", len(evs), err)
		}
	})
}

func TestClean(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		n    int
		want string
	}{
		{"plain", 10, "plain"},
		{"a\x00b", 10, "a\uFFFDb"},
		{"a\xffb", 10, "a\uFFFDb"},
		{"abcdefghij", 5, "ab…"},
		{"ééééé", 6, "é…"}, // never cuts a rune in half
	}
	for _, tc := range cases {
		if got := audit.Clean(tc.in, tc.n); got != tc.want || len(got) > tc.n {
			t.Errorf("Clean(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestParseQueryRefusesNULAndInvalidUTF8(t *testing.T) {
	t.Parallel()
	for _, q := range []string{"actor:a\x00b", "target:\xff", "abc\x00", strings.Repeat("x", 5000)} {
		if _, err := audit.ParseQuery(q); err == nil {
			t.Errorf("ParseQuery(%q) accepted", q[:min(len(q), 20)])
		}
	}
}

// closingWriter closes the database on the first write it receives, so
// the export's next read fails after rows were sent.
type closingWriter struct {
	buf   bytes.Buffer
	close func()
}

func (w *closingWriter) Write(p []byte) (int, error) {
	if w.close != nil {
		w.close()
		w.close = nil
	}
	return w.buf.Write(p)
}

// TestExportFailureIsMarked: a database failure mid-export ends the
// stream with a marker a reader can detect; one before anything was
// written leaves the writer untouched.
func TestExportFailureIsMarked(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		for _, format := range []string{audit.FormatJSONL, audit.FormatCSV} {
			t.Run(format, func(t *testing.T) {
				l, db := newLog(t, d)
				seedVaried(t, l, 1100) // more than one export batch
				sqlDB, err := db.DB()
				if err != nil {
					t.Fatal(err)
				}
				w := &closingWriter{close: func() { sqlDB.Close() }}
				err = l.Export(context.Background(), audit.Filter{}, w, format)
				if !errors.Is(err, audit.ErrExportIncomplete) {
					t.Fatalf("export error %v, want ErrExportIncomplete", err)
				}
				lines := strings.Split(strings.TrimSpace(w.buf.String()), "\n")
				last := lines[len(lines)-1]
				if !strings.Contains(last, audit.ExportErrorMarker) || !strings.Contains(last, "1000") {
					t.Fatalf("last line %q is not the error marker after seq 1000", last)
				}
				// Nothing is written when the first read fails.
				var empty bytes.Buffer
				if err := l.Export(context.Background(), audit.Filter{}, &empty, format); err == nil || empty.Len() != 0 {
					t.Fatalf("export on a closed database: %v, %d bytes written", err, empty.Len())
				}
			})
		}
	})
}
