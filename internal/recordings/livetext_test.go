package recordings_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestLiveSearch: a running command's output is searchable batch by batch,
// with escapes removed across batch boundaries, words and characters split
// between batches found whole, and the entry at the end equal to the
// whole output stripped at once. Issue 22, item 4.
func TestLiveSearch(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		c := command(t, db, "me")
		lease := time.Now().Add(time.Minute)
		// A bold word split in two, "café" split inside its é, a window
		// title (OSC) split in two, a colour split inside its CSI.
		batches := []string{"\x1b[1mbuild star", "ted: caf\xc3", "\xa9 ok\x1b]0;secr", "ettitle\x07 done \x1b[3", "1mgreenery\x1b[0m\r\n"}
		find := func(term string) []recordings.Hit {
			t.Helper()
			hits, err := recordings.Search(ctx, db, recordings.Query{Text: []string{term}}, 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			return hits
		}
		steps := []struct {
			after    int // batches stored
			found    []string
			notFound []string
		}{
			{1, []string{"seq", "build"}, []string{"1mbuild"}}, // the command line and the first batch at once
			// The word split between batches is one word once its rest came.
			{2, []string{"started", "build started"}, []string{"star", "ted"}},
			{3, []string{"café", "ok"}, []string{"caf"}},
			{5, []string{"done", "greenery", "build started"}, []string{"secrettitle", "ettitle", "1mgreenery", "31m"}},
		}
		stored := 0
		for _, st := range steps {
			for ; stored < st.after; stored++ {
				out := recordings.Output{Chunks: []recordings.Chunk{{Seq: uint64(stored + 1), Stream: recordings.StreamPTY,
					At: c.StartedAt.Add(time.Duration(stored+1) * time.Second), Data: []byte(batches[stored])}}}
				if _, err := recordings.AppendOutput(ctx, db, c.ID, "me", out, lease); err != nil {
					t.Fatal(err)
				}
			}
			for _, w := range st.found {
				hits := find(w)
				if len(hits) != 1 || hits[0].Command.ID != c.ID || hits[0].Command.State != recordings.StateRunning {
					t.Fatalf("after %d batches %q found %+v, want the running command", st.after, w, hits)
				}
			}
			for _, w := range st.notFound {
				if hits := find(w); len(hits) != 0 {
					t.Fatalf("after %d batches %q found %d commands", st.after, w, len(hits))
				}
			}
		}
		hits := find("greenery")
		if hits[0].At < 5 || hits[0].At > 5.01 || !strings.Contains(hits[0].Snippet, "greenery") {
			t.Fatalf("hit at %v snippet %q", hits[0].At, hits[0].Snippet)
		}

		exit := 0
		if _, err := recordings.Finish(ctx, db, log, c.ID, "me", recordings.End{State: recordings.StateExited, ExitCode: &exit, At: time.Now()},
			audit.Actor{Type: audit.ActorSystem, Name: "test"}); err != nil {
			t.Fatal(err)
		}
		var body string
		if err := db.Raw("SELECT body FROM recording_text WHERE command_id = ?", c.ID).Row().Scan(&body); err != nil {
			t.Fatal(err)
		}
		if want := recordings.Strip([]byte(strings.Join(batches, ""))); body != want {
			t.Fatalf("indexed batch by batch %q, stripped at once %q", body, want)
		}
		if hits := find("greenery"); len(hits) != 1 || hits[0].Command.State != recordings.StateExited {
			t.Fatalf("after the end %+v", hits)
		}
	})
}

// TestLiveSearchCommandWithoutOutput: a command that printed nothing is
// still found by its command line once it ended.
func TestLiveSearchCommandWithoutOutput(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		c := command(t, db, "me")
		if _, err := recordings.Finish(ctx, db, log, c.ID, "me", recordings.End{State: recordings.StateKilled, At: time.Now()},
			audit.Actor{Type: audit.ActorSystem, Name: "test"}); err != nil {
			t.Fatal(err)
		}
		hits, err := recordings.Search(ctx, db, recordings.Query{Text: []string{"seq"}}, 0, 10)
		if err != nil || len(hits) != 1 {
			t.Fatalf("hits %+v %v", hits, err)
		}
	})
}

// TestLiveSearchThrottle: within IndexEvery of the last index write a
// batch waits in the recording (the follower is told to come back), and
// the next poll, with output or without, indexes it.
func TestLiveSearchThrottle(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		c := command(t, db, "me")
		lease := time.Now().Add(time.Minute)
		at := time.Now().Add(-time.Minute) // the batches were read a minute ago
		put := func(seq uint64, at time.Time, text string) recordings.Command {
			t.Helper()
			out := recordings.Output{}
			if text != "" {
				out.Chunks = []recordings.Chunk{{Seq: seq, Stream: recordings.StreamPTY, At: at, Data: []byte(text)}}
			}
			got, err := recordings.AppendOutput(ctx, db, c.ID, "me", out, lease)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		found := func(w string) bool {
			t.Helper()
			hits, err := recordings.Search(ctx, db, recordings.Query{Text: []string{w}}, 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			return len(hits) == 1
		}
		if got := put(1, at, "first-batch alpha\r\n"); recordings.IndexLags(got) || !found("alpha") {
			t.Fatal("the first batch is not indexed at once")
		}
		got := put(2, at.Add(100*time.Millisecond), "second-batch omega\r\n")
		if !recordings.IndexLags(got) || found("omega") {
			t.Fatalf("a batch within %v of the last write was indexed at once (lags %v)", recordings.IndexEvery, recordings.IndexLags(got))
		}
		// A poll that brought nothing, a second later: what waited is
		// indexed.
		if got := put(0, time.Time{}, ""); recordings.IndexLags(got) || !found("omega") || !found("alpha") {
			t.Fatal("the batch that waited is not indexed by the next poll")
		}
	})
}
