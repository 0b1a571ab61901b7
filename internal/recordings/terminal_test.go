package recordings_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestTerminalCommandEvents: a batch's exec records give a command on a
// TTY one terminal.command per program its shell started directly (first
// exec after the fork), by the command's actor, with the exit code when
// the exit record came in the same batch; a batch stored again adds none,
// a command without a TTY has none, and exec records count in neither
// the output bytes nor break verification.
func TestTerminalCommandEvents(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		c := command(t, db, "me")
		if err := db.Exec("UPDATE commands SET tty = ? WHERE id = ?", true, c.ID).Error; err != nil {
			t.Fatal(err)
		}
		at := time.Now().UTC()
		records := `{"type":"exec","time":"2026-12-02T01:00:00Z","pid":10,"ppid":1,"depth":1,"first":true,"shell_child":true,"cwd":"/w","argv":["/bin/ls","-l"]}
{"type":"exec","time":"2026-12-02T01:00:00Z","pid":12,"ppid":10,"depth":2,"first":true,"argv":["grandchild"]}
{"type":"exec","time":"2026-12-02T01:00:00Z","pid":10,"ppid":1,"depth":1,"shell_child":true,"argv":["/bin/ls","again"]}
{"type":"exit","time":"2026-12-02T01:00:01Z","pid":10,"ppid":1,"depth":1,"shell_child":true,"exit_code":3}
{"type":"exec","time":"2026-12-02T01:00:02Z","pid":11,"ppid":1,"depth":1,"first":true,"shell_child":true,"argv_unavailable":true,"comm":"vim"}
`
		out := recordings.Output{Audit: log, Chunks: []recordings.Chunk{
			{Seq: 1, Stream: recordings.StreamPTY, At: at, Data: []byte("$ ls -l\r\n")},
			{Seq: 2, Stream: recordings.StreamExec, At: at, Data: []byte(records)},
			{Seq: 3, Stream: recordings.StreamPTY, At: at, Data: []byte("total 0\r\n")},
		}}
		lease := at.Add(time.Minute)
		for range 2 { // the second time is a batch read again
			if _, err := recordings.AppendOutput(ctx, db, c.ID, "me", out, lease); err != nil {
				t.Fatal(err)
			}
		}
		f, err := audit.ParseQuery("action:terminal.command")
		if err != nil {
			t.Fatal(err)
		}
		evs, err := log.Query(ctx, f, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 2 {
			t.Fatalf("%d terminal.command events, want 2: %+v", len(evs), evs)
		}
		type details struct {
			Argv            []string `json:"argv"`
			ExitCode        *int     `json:"exit_code"`
			ArgvUnavailable bool     `json:"argv_unavailable"`
			Comm            string   `json:"comm"`
			Cwd             string   `json:"cwd"`
		}
		byPID := map[string]details{}
		for _, e := range evs {
			if e.Actor != (audit.Actor{Type: "user", ID: "1", Name: "u"}) {
				t.Errorf("event by %+v, want the command's actor", e.Actor)
			}
			var dd details
			if err := json.Unmarshal(e.Details, &dd); err != nil {
				t.Fatal(err)
			}
			byPID[e.Target.Name] = dd
		}
		ls, vim := byPID["/bin/ls -l"], byPID["(vim, pid 11 ended before its arguments could be read)"]
		if ls.ExitCode == nil || *ls.ExitCode != 3 || ls.Cwd != "/w" {
			t.Errorf("ls event %+v: want exit code 3, cwd /w", ls)
		}
		if !vim.ArgvUnavailable || vim.Comm != "vim" || vim.ExitCode != nil {
			t.Errorf("vim event %+v: want argv_unavailable with comm, no exit code", vim)
		}
		// Without a TTY (an agent's exec) the shell's children are not
		// terminal commands: its command.exec is its audit record.
		if err := db.Exec("UPDATE commands SET tty = ? WHERE id = ?", false, c.ID).Error; err != nil {
			t.Fatal(err)
		}
		more := recordings.Output{Audit: log, Chunks: []recordings.Chunk{{Seq: 4, Stream: recordings.StreamExec, At: at,
			Data: []byte(`{"type":"exec","pid":20,"ppid":1,"depth":1,"first":true,"shell_child":true,"argv":["make"]}` + "\n")}}}
		if _, err := recordings.AppendOutput(ctx, db, c.ID, "me", more, lease); err != nil {
			t.Fatal(err)
		}
		if evs, err := log.Query(ctx, f, 0, 100); err != nil || len(evs) != 2 {
			t.Fatalf("%d terminal.command events after a batch of a command without a TTY (%v), want still 2", len(evs), err)
		}
		got, err := recordings.Get(ctx, db, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(len("$ ls -l\r\n") + len("total 0\r\n")); got.OutBytes != want {
			t.Errorf("output bytes %d, want %d (exec records are not output)", got.OutBytes, want)
		}
		ended, err := recordings.Finish(ctx, db, log, c.ID, "me", recordings.End{State: recordings.StateExited, At: at}, audit.Actor{Type: audit.ActorSystem, Name: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if v, err := recordings.Verify(ctx, db, c.ID, ended.OutHash, ended.InHash); err != nil || !v.OK || v.OutBytes != ended.OutBytes {
			t.Fatalf("verify %+v (%v)", v, err)
		}
	})
}
