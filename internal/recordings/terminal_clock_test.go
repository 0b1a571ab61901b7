package recordings_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestTerminalCommandHostClockAhead: a program's terminal.command is
// attributed to who typed before the console received its record, even
// when agentd's clock (the host's) says it started later: a keystroke by
// someone else stored after the record arrived is not blamed for it.
func TestTerminalCommandHostClockAhead(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		c := command(t, db, "me")
		if err := db.Exec("UPDATE commands SET tty = ? WHERE id = ?", true, c.ID).Error; err != nil {
			t.Fatal(err)
		}
		mia := recordings.Typist{Type: "user", ID: "1", Name: "mia@acme.test", Via: "login:0123456789ab"}
		olive := recordings.Typist{Type: "user", ID: "2", Name: "olive@acme.test", Via: "login:ba9876543210"}
		t0 := c.StartedAt.Add(time.Second)
		// Mia types at t0; the console receives the program's record at
		// t0+1s; Olive types at t0+5s. The host's clock is a minute ahead.
		for _, in := range []struct {
			who recordings.Typist
			at  time.Time
		}{{mia, t0}, {olive, t0.Add(5 * time.Second)}} {
			if _, err := recordings.AppendInput(ctx, db, c.SessionID, c.ID, []byte("x\n"), false, in.at, in.who); err != nil {
				t.Fatal(err)
			}
		}
		hostTime := t0.Add(time.Minute).UTC().Format(time.RFC3339Nano)
		rec := fmt.Sprintf(`{"type":"exec","time":%q,"pid":10,"ppid":1,"depth":1,"first":true,"shell_child":true,"argv":["/bin/rm","-rf","x"]}`+"\n", hostTime)
		out := recordings.Output{Audit: log, Chunks: []recordings.Chunk{{Seq: 1, Stream: recordings.StreamExec, At: t0.Add(time.Second), Data: []byte(rec)}}}
		if _, err := recordings.AppendOutput(ctx, db, c.ID, "me", out, time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		f, err := audit.ParseQuery("action:terminal.command")
		if err != nil {
			t.Fatal(err)
		}
		evs, err := log.Query(ctx, f, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 1 || evs[0].Actor.Name != mia.Name {
			t.Fatalf("events %+v: want one terminal.command by %s", evs, mia.Name)
		}
	})
}
