package recordings_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestReadAfterSmallChunks stores a recording of many keystroke-sized
// chunks over more frames than one page of reading (with a gap and an
// empty chunk among them) and checks ReadAfter at cursors before, inside,
// at the edges of and after frames, under byte caps from none to all: it
// returns exactly the chunks after the cursor, the first always, then as
// many as fit in the cap, and more says whether any are left.
func TestReadAfterSmallChunks(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		c := command(t, db, "me")
		at := time.Now()
		lease := at.Add(time.Minute)
		var all []recordings.Chunk // what was recorded, in order
		var edges []uint64         // first and last seq of each frame
		seq := uint64(0)
		for f := range 150 {
			var out recordings.Output
			if f == 40 {
				// agentd dropped 100 bytes: the gap takes the id before
				// the chunks that survived.
				seq++
				out.Dropped = 100
				all = append(all, recordings.Chunk{Seq: seq, Stream: recordings.StreamGap, Data: []byte("100")})
			}
			for j := range 1 + (f*7)%5 {
				seq++
				data := []byte(fmt.Sprintf("%d", seq))[:(int(seq)+j)%4]
				ch := recordings.Chunk{Seq: seq, Stream: recordings.StreamPTY, At: at, Data: data}
				out.Chunks = append(out.Chunks, ch)
				all = append(all, ch)
			}
			if _, err := recordings.AppendOutput(ctx, db, c.ID, "me", out, lease); err != nil {
				t.Fatal(err)
			}
			first := out.Chunks[0].Seq
			if out.Dropped > 0 {
				first--
			}
			edges = append(edges, first, seq)
		}
		want := func(after uint64, maxBytes int) (cs []recordings.Chunk, more bool) {
			n := 0
			for _, ch := range all {
				if ch.Seq <= after {
					continue
				}
				if len(cs) > 0 && n+len(ch.Data) > maxBytes {
					return cs, true
				}
				cs, n = append(cs, ch), n+len(ch.Data)
			}
			return cs, false
		}
		same := func(got, want []recordings.Chunk) bool {
			if len(got) != len(want) {
				return false
			}
			for i := range got {
				if got[i].Seq != want[i].Seq || got[i].Stream != want[i].Stream || !bytes.Equal(got[i].Data, want[i].Data) {
					return false
				}
			}
			return true
		}
		seqs := func(cs []recordings.Chunk) string {
			var b []byte
			for _, ch := range cs {
				b = strconv.AppendUint(b, ch.Seq, 10)
				b = append(b, ' ')
			}
			return string(b)
		}
		cursors := []uint64{0, 1, 2, seq - 1, seq, seq + 5}
		for i := 0; i < len(edges); i += 13 {
			e := edges[i]
			cursors = append(cursors, e-1, e, e+1)
		}
		for _, after := range cursors {
			for _, maxBytes := range []int{0, 1, 5, 37, 200, 1 << 20} {
				got, more, err := recordings.ReadAfter(ctx, db, c.ID, recordings.KindOut, after, maxBytes)
				if err != nil {
					t.Fatal(err)
				}
				if w, wmore := want(after, maxBytes); !same(got, w) || more != wmore {
					t.Fatalf("ReadAfter(%d, cap %d) = %s more %v, want %s more %v", after, maxBytes, seqs(got), more, seqs(w), wmore)
				}
			}
		}
		t.Run("paging with the cursor returned reads each chunk once", func(t *testing.T) {
			var got []recordings.Chunk
			after := uint64(0)
			for {
				cs, more, err := recordings.ReadAfter(ctx, db, c.ID, recordings.KindOut, after, 16)
				if err != nil {
					t.Fatal(err)
				}
				if len(cs) == 0 && more {
					t.Fatalf("no chunks after %d, but more", after)
				}
				got = append(got, cs...)
				if !more {
					break
				}
				after = cs[len(cs)-1].Seq
			}
			if !same(got, all) {
				t.Fatalf("paged read %s, want %s", seqs(got), seqs(all))
			}
		})
	})
}

// TestVerifyAcrossPages checks Verify on a recording of more frames than
// one page of reading, and its message for each kind of damage to a frame
// past the first page.
func TestVerifyAcrossPages(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		c := command(t, db, "me")
		at := time.Now()
		lease := at.Add(time.Minute)
		outBytes := int64(0)
		for i := uint64(1); i <= 150; i++ {
			data := []byte(fmt.Sprintf("line %d\n", i))
			outBytes += int64(len(data))
			out := recordings.Output{Chunks: []recordings.Chunk{{Seq: i, Stream: recordings.StreamStdout, At: at, Data: data}}}
			if _, err := recordings.AppendOutput(ctx, db, c.ID, "me", out, lease); err != nil {
				t.Fatal(err)
			}
		}
		ended, err := recordings.AppendInput(ctx, db, c.SessionID, c.ID, []byte("typed"), true, at, recordings.Typist{Type: "user", ID: "1", Name: "u"})
		if err != nil {
			t.Fatal(err)
		}
		cur, err := recordings.Get(ctx, db, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		v, err := recordings.Verify(ctx, db, c.ID, cur.OutHash, ended.InHash)
		if err != nil || !v.OK || v.OutBytes != outBytes || v.InBytes != 5 || v.OutputHash != cur.OutHash || v.InputHash != ended.InHash || v.Problem != "" {
			t.Fatalf("Verify = %+v, %v", v, err)
		}
		if v, err := recordings.Verify(ctx, db, c.ID, cur.OutHash, "x"); err != nil || v.OK || v.Problem != "the input recording does not match its end event" {
			t.Fatalf("Verify with another input head = %+v, %v", v, err)
		}
		if v, err := recordings.Verify(ctx, db, c.ID, "x", ended.InHash); err != nil || v.OK || v.Problem != "the output recording does not match its end event" {
			t.Fatalf("Verify with another output head = %+v, %v", v, err)
		}
		var body []byte
		var prev string
		if err := db.Raw("SELECT body, prev_hash FROM recording_frames WHERE command_id = ? AND kind = 'out' AND first_seq = 120", c.ID).Row().Scan(&body, &prev); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			set  string
			arg  any
			want string
		}{
			{"body", []byte("not a frame"), "out frame at 120 cannot be read"},
			{"body", recordings.ForgeFrame(t, body), "out frame at 120 was changed"},
			{"prev_hash", "x", "out frame at 120 does not follow the one before"},
		} {
			if err := db.Exec("UPDATE recording_frames SET "+tc.set+" = ? WHERE command_id = ? AND kind = 'out' AND first_seq = 120", tc.arg, c.ID).Error; err != nil {
				t.Fatal(err)
			}
			v, err := recordings.Verify(ctx, db, c.ID, cur.OutHash, ended.InHash)
			if err != nil || v.OK || v.Problem != tc.want {
				t.Errorf("Verify with the %s of frame 120 changed = %+v, %v; want %q", tc.set, v, err, tc.want)
			}
			if err := db.Exec("UPDATE recording_frames SET body = ?, prev_hash = ? WHERE command_id = ? AND kind = 'out' AND first_seq = 120", body, prev, c.ID).Error; err != nil {
				t.Fatal(err)
			}
		}
	})
}
