package sessions_test

import (
	"context"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestMarkClosing: the mark and its event are one commit; a second mark
// keeps the first time and still writes its event; an event that cannot
// be written leaves no mark.
func TestMarkClosing(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d, e2bfake.Config{})
		svc := w.svc(nil)
		log := audit.NewLog(w.db, audit.OrgTable, nil)
		ctx := context.Background()
		closingAt := func(id int64) *time.Time {
			t.Helper()
			var at struct{ ClosingAt *time.Time }
			if err := w.db.Table("sessions").Select("closing_at").Where("id = ?", id).Take(&at).Error; err != nil {
				t.Fatal(err)
			}
			return at.ClosingAt
		}
		ev := func(s sessions.Session) audit.Event {
			return audit.Event{Actor: audit.Actor{Type: audit.ActorUser, ID: "1", Name: "mia"}, Action: "session.closing",
				Target: sessions.AuditTarget(s)}
		}

		s := w.newSession(t, svc, sys())
		if closingAt(s.ID) != nil {
			t.Fatal("a new session is marked closing")
		}
		if err := sessions.MarkClosing(ctx, w.db, log, s.ID, ev(s)); err != nil {
			t.Fatal(err)
		}
		first := closingAt(s.ID)
		if first == nil {
			t.Fatal("not marked closing")
		}
		if err := sessions.MarkClosing(ctx, w.db, log, s.ID, ev(s)); err != nil {
			t.Fatal(err)
		}
		if again := closingAt(s.ID); again == nil || !again.Equal(*first) {
			t.Fatalf("a second mark moved the first: %v, then %v", first, again)
		}
		n := 0
		for _, a := range w.auditActions(t, s.ID) {
			if a == "session.closing" {
				n++
			}
		}
		if n != 2 {
			t.Fatalf("%d session.closing events, want one per mark", n)
		}

		// An event refused by the audit log (here: no actor type) rolls
		// the mark back.
		other := w.newSession(t, svc, sys())
		if err := sessions.MarkClosing(ctx, w.db, log, other.ID, audit.Event{Action: "session.closing"}); err == nil {
			t.Fatal("a mark whose event was refused succeeded")
		}
		if closingAt(other.ID) != nil {
			t.Fatal("a mark whose event was refused was kept")
		}
	})
}
