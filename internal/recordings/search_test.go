package recordings_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

func validationText(err error) string {
	var v *apperr.ValidationError
	if errors.As(err, &v) {
		return fmt.Sprint(v.Fields)
	}
	return ""
}

// recorded runs command cmd through the recording lifecycle in the
// session of first (a command from the command helper): started at start,
// output written in pieces one second apart, ended with exit code exit.
func recorded(t *testing.T, db *gorm.DB, log *audit.Log, first recordings.Command, cmd string, start time.Time, exit int, pieces ...string) recordings.Command {
	t.Helper()
	ctx := context.Background()
	lease := time.Now().Add(time.Minute)
	c := recordings.Command{SessionID: first.SessionID, AgentdID: fmt.Sprintf("gh-%s-%d", t.Name(), start.UnixNano()), Command: cmd,
		ActorType: "user", ActorID: "7", ActorName: "mia@acme.test", StartedAt: start, LeaseOwner: "me", LeaseUntil: &lease}
	if err := recordings.Start(ctx, db, &c); err != nil {
		t.Fatal(err)
	}
	for i, p := range pieces {
		out := recordings.Output{Chunks: []recordings.Chunk{{Seq: uint64(i + 1), Stream: recordings.StreamPTY, At: start.Add(time.Duration(i+1) * time.Second), Data: []byte(p)}}}
		if _, err := recordings.AppendOutput(ctx, db, c.ID, "me", out, lease); err != nil {
			t.Fatal(err)
		}
	}
	c, err := recordings.Finish(ctx, db, log, c.ID, "me", recordings.End{State: recordings.StateExited, ExitCode: &exit, At: start.Add(time.Duration(len(pieces)+1) * time.Second)}, audit.Actor{Type: audit.ActorSystem, Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCastAndText(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		first := command(t, db, "me")
		start := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
		// "ü" split across two chunks, colours, a CR LF.
		pieces := []string{"\x1b[32mgr\xc3", "\xbcn\x1b[0m\r\n", "second line <&>\r\n"}
		c := recorded(t, db, log, first, "printf stuff", start, 0, pieces...)
		resizeAt := start.Add(1500 * time.Millisecond)

		var cast bytes.Buffer
		if err := recordings.WriteCast(ctx, db, &cast, c, recordings.CastOptions{Resizes: []recordings.Resize{{At: start, Cols: 120, Rows: 40}, {At: resizeAt, Cols: 100, Rows: 30}}}); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(&cast)
		if !sc.Scan() {
			t.Fatal("empty cast")
		}
		var hdr struct {
			Version, Width, Height int
			Timestamp              int64
		}
		if err := json.Unmarshal(sc.Bytes(), &hdr); err != nil {
			t.Fatalf("header %q: %v", sc.Text(), err)
		}
		if hdr.Version != 2 || hdr.Width != 120 || hdr.Height != 40 || hdr.Timestamp != start.Unix() {
			t.Fatalf("header %+v", hdr)
		}
		var out strings.Builder
		var times []float64
		var kinds []string
		for sc.Scan() {
			var ev []any
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || len(ev) != 3 {
				t.Fatalf("event %q: %v", sc.Text(), err)
			}
			times = append(times, ev[0].(float64))
			kinds = append(kinds, ev[1].(string))
			if ev[1] == "o" {
				out.WriteString(ev[2].(string))
			}
		}
		if want := strings.Join(pieces, ""); out.String() != want {
			t.Fatalf("output events concatenated: %q, want %q", out.String(), want)
		}
		if got := strings.Join(kinds, ","); got != "o,r,o,o" {
			t.Fatalf("event kinds %s, want o,r,o,o (the split character waits for the second chunk)", got)
		}
		if times[0] != 1 || times[1] != 1.5 || times[3] != 3 {
			t.Fatalf("event times %v", times)
		}
		for i := 1; i < len(times); i++ {
			if times[i] < times[i-1] {
				t.Fatalf("times go back: %v", times)
			}
		}

		var txt bytes.Buffer
		if err := recordings.WriteText(ctx, db, &txt, c); err != nil {
			t.Fatal(err)
		}
		if want := "grün\nsecond line <&>\n"; txt.String() != want {
			t.Fatalf("text %q, want %q", txt.String(), want)
		}
	})
}

func TestSearch(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		first := command(t, db, "me")
		day := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
		build := recorded(t, db, log, first, "make build", day, 2, "compiling\r\n", "\x1b[31merror: the \x1b[1mzebra\x1b[0m-42 module is missing\x1b[0m\r\n")
		deploy := recorded(t, db, log, first, "deploy --zebra", day.Add(24*time.Hour), 0, "finished\r\n")
		quiet := recorded(t, db, log, first, "true", day.Add(48*time.Hour), 0)
		search := func(t *testing.T, q string, before int64, limit int) []recordings.Hit {
			t.Helper()
			f, err := recordings.ParseQuery(q)
			if err != nil {
				t.Fatalf("%s: %v %s", q, err, validationText(err))
			}
			hits, err := recordings.Search(ctx, db, f, before, limit)
			if err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			return hits
		}
		ids := func(hs []recordings.Hit) string {
			var s []string
			for _, h := range hs {
				s = append(s, fmt.Sprint(h.Command.ID))
			}
			return strings.Join(s, ",")
		}
		cases := []struct {
			q    string
			want []recordings.Command
		}{
			{"module", []recordings.Command{build}},
			{"MISSING zebra", []recordings.Command{build}},
			{`"zebra-42 module"`, []recordings.Command{build}},
			{"zebra", []recordings.Command{deploy, build}},
			{"deploy", []recordings.Command{deploy}},
			{"exit:nonzero", []recordings.Command{build}},
			{"exit:0", []recordings.Command{quiet, deploy}},
			{"zebra since:2026-03-05", []recordings.Command{deploy}},
			{"until:2026-03-04", []recordings.Command{build}},
			{"agent:a user:mia@acme.test state:exited error", []recordings.Command{build}},
			{"agent:nobody error", nil},
			{fmt.Sprintf("session:%d compiling", first.SessionID), []recordings.Command{build}},
			{"session:999 compiling", nil},
			{"compiled", nil},
			{"31m", nil},
		}
		for _, tc := range cases {
			t.Run(tc.q, func(t *testing.T) {
				got := search(t, tc.q, 0, 0)
				want := make([]recordings.Hit, len(tc.want))
				for i, c := range tc.want {
					want[i].Command = c
				}
				if ids(got) != ids(want) {
					t.Fatalf("found [%s], want [%s]", ids(got), ids(want))
				}
			})
		}
		t.Run("a hit points at the moment and the line of the match", func(t *testing.T) {
			h := search(t, "zebra module", 0, 0)[0]
			if h.At != 2 || h.Snippet != "error: the zebra-42 module is missing" || h.Capped {
				t.Fatalf("hit at %v, snippet %q, capped %v", h.At, h.Snippet, h.Capped)
			}
			if h.AgentName != "a" {
				t.Fatalf("agent %q", h.AgentName)
			}
			if h := search(t, "deploy", 0, 0)[0]; h.At != 0 {
				t.Fatalf("a match in the command line only points at %v, want 0", h.At)
			}
		})
		t.Run("keyset paging", func(t *testing.T) {
			page := search(t, "", 0, 2)
			if ids(page) != fmt.Sprintf("%d,%d", quiet.ID, deploy.ID) {
				t.Fatalf("first page [%s]", ids(page))
			}
			rest := search(t, "", page[1].Command.ID, 2)
			if ids(rest) != fmt.Sprintf("%d,%d", build.ID, first.ID) {
				t.Fatalf("second page [%s]", ids(rest))
			}
		})
		t.Run("output past the cap is not searched", func(t *testing.T) {
			big := strings.Repeat("filler line\r\n", recordings.IndexCap/12+10) + "afterthecap\r\n"
			c := recorded(t, db, log, first, "yes filler", day.Add(72*time.Hour), 0, big)
			if got := search(t, "afterthecap", 0, 0); len(got) != 0 {
				t.Fatalf("found %s past the cap", ids(got))
			}
			h := search(t, "filler", 0, 1)
			if len(h) != 1 || h[0].Command.ID != c.ID || !h[0].Capped {
				t.Fatalf("hits %+v", h)
			}
		})
		t.Run("indexing twice keeps one entry; commands ended before search existed are indexed later", func(t *testing.T) {
			if err := db.Exec("DELETE FROM recording_text WHERE command_id = ?", build.ID).Error; err != nil {
				t.Fatal(err)
			}
			if got := search(t, "module", 0, 0); len(got) != 0 {
				t.Fatalf("found %s without its entry", ids(got))
			}
			n, err := recordings.IndexMissing(ctx, db, 100)
			if err != nil || n != 1 {
				t.Fatalf("indexed %d: %v", n, err)
			}
			if n, err := recordings.IndexMissing(ctx, db, 100); err != nil || n != 0 {
				t.Fatalf("indexed %d again: %v", n, err)
			}
			if got := search(t, "module", 0, 0); ids(got) != fmt.Sprint(build.ID) {
				t.Fatalf("found [%s] after indexing", ids(got))
			}
		})
	})
}
