package recordings

import (
	"context"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// seedFrames stores a command whose output is frames frames of perFrame
// chunks of size bytes each, chained as the follower would, and returns
// its id.
func seedFrames(tb testing.TB, db *gorm.DB, frames, perFrame, size int) int64 {
	tb.Helper()
	now := time.Now().UTC()
	for _, q := range []string{
		"INSERT INTO environments (name, kind, url, created_by, created_at, updated_at) VALUES ('h', 'host', 'http://h', 'x', ?, ?)",
		"INSERT INTO agents (name, description, config, sandbox_mode, default_environment_id, idle_timeout_seconds, reclaim_after_seconds, command_policy, created_by, created_at, updated_at) VALUES ('a', '', '{}', 'off', 1, 900, 3600, '[]', 'x', ?, ?)",
		"INSERT INTO sessions (agent_id, subject, created_by, sandbox_mode, state, created_at, updated_at) VALUES (1, 'user:1', 'x', 'off', 'running', ?, ?)",
	} {
		if err := db.Exec(q, now, now).Error; err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
	}
	c := Command{SessionID: 1, AgentdID: "gh-bench", Command: "typing", ActorType: "user", ActorID: "1", StartedAt: now, State: StateRunning}
	if err := db.Create(&c).Error; err != nil {
		tb.Fatal(err)
	}
	data := make([]byte, size)
	for i := range data {
		data[i] = 'a' + byte(i%26)
	}
	head, seq := ChainStart, uint64(0)
	var batch []frame
	for range frames {
		cs := make([]Chunk, perFrame)
		for j := range cs {
			seq++
			cs[j] = Chunk{Seq: seq, Stream: StreamPTY, At: now, Data: data}
		}
		body, h, raw, err := encodeFrame(head, cs)
		if err != nil {
			tb.Fatal(err)
		}
		batch = append(batch, frame{CommandID: c.ID, Kind: KindOut, FirstSeq: int64(cs[0].Seq), LastSeq: int64(seq), StartedAt: now,
			RawBytes: raw, Body: body, PrevHash: head, Hash: h})
		head = h
		if len(batch) == 500 {
			if err := db.Create(&batch).Error; err != nil {
				tb.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		if err := db.Create(&batch).Error; err != nil {
			tb.Fatal(err)
		}
	}
	if err := db.Model(&Command{}).Where("id = ?", c.ID).Updates(map[string]any{"last_chunk": seq, "out_hash": head}).Error; err != nil {
		tb.Fatal(err)
	}
	if err := db.Exec("ANALYZE").Error; err != nil && store.DialectOfDB(db) == store.Postgres {
		tb.Fatal(err)
	}
	return c.ID
}

// copyFrames gives others more commands each a copy of command id's
// frames: a table as large as a busy org's.
func copyFrames(tb testing.TB, db *gorm.DB, id int64, others int) {
	tb.Helper()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO commands (session_id, agentd_id, command, actor_type, actor_id, actor_name, started_at, state)
		  SELECT session_id, agentd_id || '-' || g, command, actor_type, actor_id, actor_name, started_at, state
		  FROM commands, generate_series(1, ?) g WHERE id = ?`, []any{others, id}},
		{`INSERT INTO recording_frames SELECT c.id, f.kind, f.first_seq, f.last_seq, f.started_at, f.raw_bytes, f.body, f.prev_hash, f.hash
		  FROM recording_frames f, commands c WHERE f.command_id = ? AND c.id <> f.command_id`, []any{id}},
		{"ANALYZE", nil},
	} {
		if err := db.Exec(q.sql, q.args...).Error; err != nil {
			tb.Fatalf("%s: %v", q.sql, err)
		}
	}
}

// BenchmarkReadAfter times a gateway poll answered from the recording
// (ReadAfter with the proxy's 1 MiB cap) on Postgres: keystroke-sized
// chunks one per frame, many tiny chunks in one frame, and a poll near the
// end of a long recording (alone in its table, and among 49 other such
// recordings: a million frames).
func BenchmarkReadAfter(b *testing.B) {
	ctx := context.Background()
	start := func(int, int) uint64 { return 0 }
	tail := func(f, p int) uint64 { return uint64(f*p - 10) }
	cases := []struct {
		name                   string
		frames, perFrame, size int
		after                  func(frames, perFrame int) uint64
		others                 int
	}{
		{"keystrokes_5000_frames_from_start", 5000, 1, 1, start, 0},
		{"tiny_chunks_65536_in_one_frame", 1, 65536, 16, start, 0},
		{"tiny_chunks_16_frames_of_4096", 16, 4096, 16, start, 0},
		{"keystrokes_20000_frames_tail", 20000, 1, 1, tail, 0},
		{"keystrokes_20000_frames_tail_among_1M", 20000, 1, 1, tail, 49},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			db := storetest.Open(b, store.Postgres, store.OrgSet)
			id := seedFrames(b, db, tc.frames, tc.perFrame, tc.size)
			if tc.others > 0 {
				copyFrames(b, db, id, tc.others)
			}
			after := tc.after(tc.frames, tc.perFrame)
			var n int
			for b.Loop() {
				cs, _, err := ReadAfter(ctx, db, id, KindOut, after, 1<<20)
				if err != nil {
					b.Fatal(err)
				}
				n = len(cs)
			}
			b.ReportMetric(float64(n), "chunks")
		})
	}
}
