package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestRecordingSettingsArePerOrgDatabase: an org deleted and created again
// under the same slug reads its own recording settings, not the deleted
// org's cached ones; ForgetOrg drops the org's entry.
func TestRecordingSettingsArePerOrgDatabase(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		g := &Gateway{}
		old := Org{Slug: "acme", DB: storetest.Open(t, d, store.OrgSet)}
		again := Org{Slug: "acme", DB: storetest.Open(t, d, store.OrgSet)}
		if err := recordings.SetStdinContent(ctx, old.DB, false); err != nil {
			t.Fatal(err)
		}
		if on, err := g.stdinContent(ctx, old); err != nil || on {
			t.Fatalf("the old org's setting: %v, %v; want off", on, err)
		}
		if on, err := g.stdinContent(ctx, again); err != nil || !on {
			t.Fatalf("the re-created org's setting: %v, %v; want its own default (on), not the deleted org's", on, err)
		}
		g.settings.Store(old.DB, cachedSetting{slug: "acme", at: time.Now()})
		g.ForgetOrg("acme")
		n := 0
		g.settings.Range(func(any, any) bool { n++; return true })
		if n != 0 {
			t.Errorf("after ForgetOrg: %d settings cached, want none", n)
		}
	})
}
