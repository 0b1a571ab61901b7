package recordings_test

import (
	"context"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestTypistInChain: the typist of each stdin frame is in the input chain:
// TypistBefore reads it (the opener before anything was typed), and
// changing who is said to have typed fails verification as changing what
// was typed does.
func TestTypistInChain(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		log := audit.NewLog(db, audit.OrgTable, nil)
		c := command(t, db, "me")
		mia := recordings.Typist{Type: "user", ID: "1", Name: "mia@acme.test", Via: "login:0123456789ab"}
		bot := recordings.Typist{Type: "api_key", ID: "9", Name: "deploy bot (gh_abcd)", Via: "api_key:9"}
		t0 := c.StartedAt.Add(time.Second)
		for i, w := range []struct {
			who  recordings.Typist
			text string
		}{{mia, "ls\n"}, {bot, "make\n"}, {mia, "exit\n"}} {
			if _, err := recordings.AppendInput(ctx, db, c.SessionID, c.ID, []byte(w.text), false, t0.Add(time.Duration(i)*time.Second), w.who); err != nil {
				t.Fatal(err)
			}
		}
		for _, tc := range []struct {
			at   time.Time
			want recordings.Typist
		}{
			{c.StartedAt, recordings.Opener(c)},
			{t0, mia},
			{t0.Add(1500 * time.Millisecond), bot},
			{t0.Add(time.Hour), mia},
		} {
			got, err := recordings.TypistBefore(ctx, db, c.ID, tc.at)
			if err != nil || got != tc.want {
				t.Errorf("typist at %v = %+v, %v; want %+v", tc.at.Sub(c.StartedAt), got, err, tc.want)
			}
		}
		exit := 0
		if _, err := recordings.Finish(ctx, db, log, c.ID, "me", recordings.End{State: recordings.StateExited, ExitCode: &exit, At: time.Now()},
			audit.Actor{Type: audit.ActorSystem, Name: "test"}); err != nil {
			t.Fatal(err)
		}
		if res, err := recordings.VerifyAll(ctx, db, log); err != nil || !res.OK {
			t.Fatalf("VerifyAll = %+v, %v", res, err)
		}
		var body []byte
		if err := db.Raw("SELECT body FROM recording_frames WHERE command_id = ? AND kind = 'in' ORDER BY first_seq LIMIT 1 OFFSET 1", c.ID).Row().Scan(&body); err != nil {
			t.Fatal(err)
		}
		forged := recordings.ForgeTypist(t, body, "mia@acme.test")
		if err := db.Exec("UPDATE recording_frames SET body = ? WHERE command_id = ? AND kind = 'in' AND first_seq = 3", forged, c.ID).Error; err != nil {
			t.Fatal(err)
		}
		res, err := recordings.VerifyAll(ctx, db, log)
		if err != nil || res.OK || res.FailedCommand != c.ID {
			t.Fatalf("VerifyAll after blaming another typist = %+v, %v", res, err)
		}
	})
}
