package console_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/anchor"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestStartCheckpointsOrgs: the started console's checkpoint loop takes a
// checkpoint of every active org at start (then every minute), and Close
// stops it.
func TestStartCheckpointsOrgs(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		cfg := config.Config{DataDir: t.TempDir(), MasterKey: testMasterKey, TokenTTL: time.Hour, HealthInterval: time.Hour,
			ReclaimInterval: time.Hour, RetentionInterval: time.Hour, OrgDBPrefix: storetest.NewName("gh_test_anchor_") + "_"}
		if d == store.Postgres {
			cfg.DatabaseURL = storetest.DSN(t, store.Postgres)
			storetest.DropPrefixedAtCleanup(t, cfg.OrgDBPrefix)
		}
		c, err := console.New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		org, err := c.Orgs.Create(ctx, orgs.CreateInput{Slug: "acme", OrgEvent: func(orgs.Org) audit.Event {
			return audit.Event{Actor: audit.Actor{Type: audit.ActorSystem, Name: "test"}, Action: "org.create"}
		}})
		if err != nil {
			t.Fatal(err)
		}
		stats := make(chan anchor.Stats, 1)
		c.Checkpoints.Stats = stats
		c.Start()
		defer c.Close()
		if st := <-stats; st.Orgs != 1 || st.Written != 1 {
			t.Fatalf("first round: %+v", st)
		}
		cp, err := c.Anchors.Latest(ctx, org)
		if err != nil || cp.Seq != 1 {
			t.Fatalf("checkpoint after start: %+v %v", cp, err)
		}
	})
}
