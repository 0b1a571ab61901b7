package recordings_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestTerminalCommandFlood: a loop typed at a prompt starts programs as
// fast as the kernel forks; a batch of 1,000 of them puts at most
// MaxTerminalCommandsPerBatch+1 terminal.command events in the audit log
// (the last one counting the rest), while all 1,000 stay searchable in the
// recording.
func TestTerminalCommandFlood(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		c := command(t, db, "me")
		if err := db.Exec("UPDATE commands SET tty = ? WHERE id = ?", true, c.ID).Error; err != nil {
			t.Fatal(err)
		}
		const programs = 1000
		var records strings.Builder
		for i := range programs {
			fmt.Fprintf(&records, `{"type":"exec","time":"2026-12-02T01:00:00Z","pid":%d,"ppid":1,"depth":1,"first":true,"shell_child":true,"argv":["/bin/true","n%d"]}`+"\n", 100+i, i)
		}
		at := time.Now().UTC()
		out := recordings.Output{Audit: log, Chunks: []recordings.Chunk{{Seq: 1, Stream: recordings.StreamExec, At: at, Data: []byte(records.String())}}}
		if _, err := recordings.AppendOutput(ctx, db, c.ID, "me", out, at.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		f, err := audit.ParseQuery("action:terminal.command")
		if err != nil {
			t.Fatal(err)
		}
		evs, err := log.Query(ctx, f, 0, programs)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != recordings.MaxTerminalCommandsPerBatch+1 {
			t.Fatalf("%d terminal.command events for a batch of %d programs, want %d", len(evs), programs, recordings.MaxTerminalCommandsPerBatch+1)
		}
		var coalesced struct {
			Coalesced int      `json:"coalesced"`
			FirstArgv []string `json:"first_argv"`
			LastArgv  []string `json:"last_argv"`
		}
		found := false
		for _, e := range evs {
			if strings.Contains(string(e.Details), `"coalesced"`) {
				if err := json.Unmarshal(e.Details, &coalesced); err != nil {
					t.Fatal(err)
				}
				found = true
			}
		}
		rest := programs - recordings.MaxTerminalCommandsPerBatch
		if !found || coalesced.Coalesced != rest || len(coalesced.LastArgv) != 2 || coalesced.LastArgv[1] != fmt.Sprintf("n%d", programs-1) ||
			coalesced.FirstArgv[1] != fmt.Sprintf("n%d", recordings.MaxTerminalCommandsPerBatch) {
			t.Fatalf("coalesced event %+v (found %v): want %d programs, n%d to n%d", coalesced, found, rest, recordings.MaxTerminalCommandsPerBatch, programs-1)
		}
		// Every program is still in the recording's exec stream.
		stored := 0
		err = recordings.Walk(ctx, db, c.ID, recordings.KindOut, func(ch recordings.Chunk) error {
			if ch.Stream != recordings.StreamExec {
				return nil
			}
			recs, err := agentd.ParseExecRecords(ch.Data)
			stored += len(recs)
			return err
		})
		if err != nil || stored != programs {
			t.Fatalf("the recording holds %d of the %d programs (%v)", stored, programs, err)
		}
	})
}
