package console_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// Replicas started together on an empty Postgres catalog (docker compose
// up, a new Deployment) all start, with one first admin between them and
// one one-time password printed, instead of the losers failing on the
// winner's duplicate admin.
func TestReplicasStartTogetherOnAnEmptyCatalog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := config.Config{MasterKey: testMasterKey, AdminEmail: "admin@example.com", TokenTTL: time.Hour, HealthInterval: time.Hour,
		DatabaseURL: storetest.DSN(t, store.Postgres), OrgDBPrefix: storetest.NewName("gh_test_replicas_") + "_"}
	storetest.DropPrefixedAtCleanup(t, cfg.OrgDBPrefix)
	const replicas = 3
	var wg sync.WaitGroup
	cs := make([]*console.Console, replicas)
	errs := make([]error, replicas)
	for i := range replicas {
		c := cfg
		c.DataDir = t.TempDir()
		wg.Go(func() { cs[i], errs[i] = console.New(ctx, c, slog.New(slog.NewTextHandler(io.Discard, nil))) })
	}
	wg.Wait()
	created := 0
	for i := range replicas {
		if errs[i] != nil {
			t.Errorf("replica %d did not start: %v", i, errs[i])
			continue
		}
		t.Cleanup(cs[i].Close)
		if cs[i].AdminCreated {
			created++
			if cs[i].OneTimePassword == "" {
				t.Errorf("replica %d created the admin without a one-time password", i)
			}
		}
	}
	if created != 1 {
		t.Fatalf("%d replicas created the first admin, want 1", created)
	}
	if cs[0] != nil {
		as, err := cs[0].Platform.Admins(ctx)
		if err != nil || len(as) != 1 || as[0].Email != "admin@example.com" {
			t.Fatalf("admins: %+v %v", as, err)
		}
	}
}
