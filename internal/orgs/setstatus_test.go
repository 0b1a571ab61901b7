package orgs_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestSetStatusAndItsRecordTogether is finding 3 of the attack run: a
// suspension whose platform record cannot be written does not happen,
// and one that happens has its record.
func TestSetStatusAndItsRecordTogether(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		box, err := sealed.New([]byte(strings.Repeat("m", 32)))
		if err != nil {
			t.Fatal(err)
		}
		catalog := storetest.Open(t, d, store.CatalogSet)
		log := audit.NewLog(catalog, audit.PlatformTable, nil)
		cfg := orgs.Config{Catalog: catalog, Box: box, DataDir: t.TempDir(), DBPrefix: storetest.NewName("gh_test_org_") + "_", Audit: log}
		if d == store.Postgres {
			cfg.ServerDSN = storetest.AdminDSN(t)
			storetest.DropPrefixedAtCleanup(t, cfg.DBPrefix)
		}
		svc := orgs.New(cfg)
		t.Cleanup(svc.Close)
		if _, err := svc.Create(ctx, orgs.CreateInput{Slug: "steady"}); err != nil {
			t.Fatal(err)
		}
		// An event the log refuses (no action) rolls the suspension back.
		if _, err := svc.SetStatusAudited(ctx, "steady", orgs.StatusSuspended, func(orgs.Org) audit.Event { return audit.Event{} }); err == nil {
			t.Fatal("suspended without a record")
		}
		if o, err := svc.Get(ctx, "steady"); err != nil || o.Status != orgs.StatusActive {
			t.Fatalf("after a failed record the org is %+v (%v), want active", o, err)
		}
		o, err := svc.SetStatusAudited(ctx, "steady", orgs.StatusSuspended, func(o orgs.Org) audit.Event {
			return audit.Event{Actor: audit.Actor{Type: audit.ActorSystem}, Action: "org.suspend", Target: audit.Target{Type: "organization", ID: o.Slug},
				Details: audit.Details(map[string]string{"status": o.Status})}
		})
		if err != nil || o.Status != orgs.StatusSuspended {
			t.Fatalf("suspend: %+v, %v", o, err)
		}
		f, _ := audit.ParseQuery("action:org.suspend")
		evs, err := log.Query(ctx, f, 0, 10)
		if err != nil || len(evs) != 1 || !strings.Contains(string(evs[0].Details), `"suspended"`) {
			t.Fatalf("records: %+v, %v", evs, err)
		}
	})
}
