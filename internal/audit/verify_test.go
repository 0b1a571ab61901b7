package audit_test

import (
	"context"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

func TestVerifyDetectsTampering(t *testing.T) {
	t.Parallel()
	exec := func(t *testing.T, db *gorm.DB, sql string, args ...any) {
		t.Helper()
		res := db.Exec(sql, args...)
		if res.Error != nil {
			t.Fatalf("%s: %v", sql, res.Error)
		}
		if res.RowsAffected == 0 {
			t.Fatalf("%s changed nothing", sql)
		}
	}
	tests := []struct {
		name       string
		tamper     func(t *testing.T, db *gorm.DB, evs []audit.Event)
		brokenAt   int64
		reasonPart string
	}{
		{name: "intact", tamper: func(*testing.T, *gorm.DB, []audit.Event) {}},
		{name: "update action", brokenAt: 5, reasonPart: "hash", tamper: func(t *testing.T, db *gorm.DB, _ []audit.Event) {
			exec(t, db, "UPDATE audit_events SET action = 'user.logout' WHERE seq = 5")
		}},
		{name: "edit details", brokenAt: 6, reasonPart: "hash", tamper: func(t *testing.T, db *gorm.DB, _ []audit.Event) {
			exec(t, db, `UPDATE audit_events SET details = '{"command":"ls"}' WHERE seq = 6`)
		}},
		{name: "edit decision", brokenAt: 4, reasonPart: "hash", tamper: func(t *testing.T, db *gorm.DB, _ []audit.Event) {
			exec(t, db, "UPDATE audit_events SET decision = 'allow' WHERE seq = 4")
		}},
		{name: "edit time", brokenAt: 2, reasonPart: "hash", tamper: func(t *testing.T, db *gorm.DB, evs []audit.Event) {
			exec(t, db, "UPDATE audit_events SET occurred_at = ? WHERE seq = 2", evs[2].Time)
		}},
		{name: "delete middle row", brokenAt: 5, reasonPart: "missing", tamper: func(t *testing.T, db *gorm.DB, _ []audit.Event) {
			exec(t, db, "DELETE FROM audit_events WHERE seq = 5")
		}},
		{name: "delete first row", brokenAt: 1, reasonPart: "missing", tamper: func(t *testing.T, db *gorm.DB, _ []audit.Event) {
			exec(t, db, "DELETE FROM audit_events WHERE seq = 1")
		}},
		{name: "swap seq values", brokenAt: 3, reasonPart: "link", tamper: func(t *testing.T, db *gorm.DB, _ []audit.Event) {
			exec(t, db, "UPDATE audit_events SET seq = -1 WHERE seq = 3")
			exec(t, db, "UPDATE audit_events SET seq = 3 WHERE seq = 7")
			exec(t, db, "UPDATE audit_events SET seq = 7 WHERE seq = -1")
		}},
		{name: "swap adjacent seq values", brokenAt: 8, reasonPart: "link", tamper: func(t *testing.T, db *gorm.DB, _ []audit.Event) {
			exec(t, db, "UPDATE audit_events SET seq = -1 WHERE seq = 8")
			exec(t, db, "UPDATE audit_events SET seq = 8 WHERE seq = 9")
			exec(t, db, "UPDATE audit_events SET seq = 9 WHERE seq = -1")
		}},
		{name: "edit and rehash", brokenAt: 6, reasonPart: "link", tamper: func(t *testing.T, db *gorm.DB, evs []audit.Event) {
			// Recomputing the edited row's own hash moves the break to the
			// next row, whose link no longer matches.
			e := evs[4]
			e.Action = "user.logout"
			exec(t, db, "UPDATE audit_events SET action = ?, hash = ? WHERE seq = 5", e.Action, audit.Hash(e))
		}},
		{name: "edit last row", brokenAt: 10, reasonPart: "hash", tamper: func(t *testing.T, db *gorm.DB, _ []audit.Event) {
			exec(t, db, "UPDATE audit_events SET actor_name = 'someone else' WHERE seq = 10")
		}},
	}
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				l, db := newLog(t, d)
				evs := seedVaried(t, l, 10)
				tc.tamper(t, db, evs)
				res, err := l.Verify(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if tc.brokenAt == 0 {
					if !res.OK || res.Checked != 10 || res.HeadSeq != 10 || res.HeadHash != evs[9].Hash {
						t.Fatalf("intact chain: %+v", res)
					}
					return
				}
				if res.OK || res.BrokenAt != tc.brokenAt || !strings.Contains(res.Reason, tc.reasonPart) {
					t.Fatalf("Verify = %+v, want broken at %d (%s)", res, tc.brokenAt, tc.reasonPart)
				}
				if res.Checked != tc.brokenAt-1 {
					t.Fatalf("checked %d before the break at %d", res.Checked, tc.brokenAt)
				}
			})
		}
	})
}
