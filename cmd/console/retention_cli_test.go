package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/retention"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// `console retention run --org acme [--as-of T]` applies the org's policy
// once as of T: it removes (and archives) exactly the events older than
// the policy at T, audits the run naming who ran it, and leaves a chain
// that verifies; a run that finds nothing to remove writes no audit event;
// a time later than now, or no org, is refused.
func TestRetentionRunCommand(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		dir := t.TempDir()
		env := map[string]string{"GATEHOUSE_ORG_DB_PREFIX": storetest.NewName("gh_test_org_") + "_"}
		cfg := config.Config{DataDir: dir, TokenTTL: time.Hour, OrgDBPrefix: env["GATEHOUSE_ORG_DB_PREFIX"]}
		if d == store.Postgres {
			key := make([]byte, 32)
			_, _ = rand.Read(key)
			cfg.DatabaseURL, cfg.MasterKey = storetest.DSN(t, store.Postgres), hex.EncodeToString(key)
			env["DATABASE_URL"], env["GATEHOUSE_MASTER_KEY"] = cfg.DatabaseURL, cfg.MasterKey
			storetest.DropPrefixedAtCleanup(t, cfg.OrgDBPrefix)
		}
		c, err := console.New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		if _, err := c.Orgs.Create(ctx, orgs.CreateInput{Slug: "acme", Name: "Acme"}); err != nil {
			t.Fatal(err)
		}
		ten, err := c.Tenants.Open(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ten.Release)
		// 20 events a day apart, 40 to 21 days old, then 2 of now.
		now := time.Now().UTC().Truncate(time.Second)
		day0 := now.Add(-40 * 24 * time.Hour)
		i := 0
		old := audit.NewLog(ten.DB, audit.OrgTable, func() time.Time { t := day0.Add(time.Duration(i) * 24 * time.Hour); i++; return t })
		for range 20 {
			if _, err := old.Append(ctx, audit.Event{Actor: audit.Actor{Type: audit.ActorUser, ID: "1", Name: "alice"}, Action: "thing.do"}); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 {
			if _, err := ten.Audit.Append(ctx, audit.Event{Actor: audit.Actor{Type: audit.ActorUser, ID: "1", Name: "alice"}, Action: "thing.do"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := ten.DB.Transaction(func(tx *gorm.DB) error {
			return retention.Save(ctx, tx, retention.Policy{AuditDays: 7, RecordingsDays: 30})
		}); err != nil {
			t.Fatal(err)
		}
		cli := func(args ...string) (string, error) {
			var out bytes.Buffer
			err := run(ctx, append([]string{"--data-dir", dir}, args...), func(k string) string { return env[k] }, &out, io.Discard)
			return out.String(), err
		}
		count := func(q string) int {
			evs, err := ten.Audit.Query(ctx, mustQuery(t, q), 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			return len(evs)
		}

		t.Run("as of 25 days ago", func(t *testing.T) {
			// The cutoff is 32 days ago: the events of days 40 to 33 go.
			asOf := now.Add(-25 * 24 * time.Hour).Format(time.RFC3339)
			out, err := cli("retention", "run", "--org", "acme", "--as-of", asOf)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, want := range []string{"applied as of " + asOf, ": 8 removed (archives", "the chain now starts after event 8", "recorded in the organization's audit log as retention.apply"} {
				if !strings.Contains(strings.ToLower(out), strings.ToLower(want)) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if n := count("action:" + recordings.RetentionAction); n != 1 {
				t.Fatalf("%d retention.apply events, want 1", n)
			}
			evs, err := ten.Audit.Query(ctx, mustQuery(t, "action:"+recordings.RetentionAction), 0, 1)
			if err != nil || len(evs) != 1 || !strings.HasPrefix(evs[0].Actor.Name, "console retention run (OS user ") {
				t.Fatalf("the run is not audited as the operator's: %+v %v", evs, err)
			}
			if out, err := cli("audit", "verify", "--org", "acme"); err != nil || !strings.Contains(out, "ok: 15 events verified") {
				t.Fatalf("verify after the run: %v\n%s", err, out)
			}
		})

		t.Run("again: nothing removed, nothing audited", func(t *testing.T) {
			out, err := cli("retention", "run", "--org", "acme", "--as-of", now.Add(-25*24*time.Hour).Format(time.RFC3339))
			if err != nil || !strings.Contains(out, "nothing removed, nothing audited") {
				t.Fatalf("%v\n%s", err, out)
			}
			if n := count("action:" + recordings.RetentionAction); n != 1 {
				t.Fatalf("%d retention.apply events after a run that removed nothing, want 1", n)
			}
		})

		t.Run("now", func(t *testing.T) {
			// The cutoff is 7 days ago: the events of days 32 to 21 go
			// (12); the two of today and the first run's record stay.
			out, err := cli("retention", "run", "--org", "acme")
			if err != nil || !strings.Contains(out, ": 12 removed") {
				t.Fatalf("%v\n%s", err, out)
			}
			if n := count("action:" + recordings.RetentionAction); n != 2 {
				t.Fatalf("%d retention.apply events, want 2", n)
			}
		})

		if d == store.Postgres {
			t.Run("another replica is at it", func(t *testing.T) {
				unlock, ok, err := store.TryAdvisoryLock(ctx, ten.DB, store.LockKey("gatehouse-retention:acme"))
				if err != nil || !ok {
					t.Fatalf("take the replica's lock: %v %v", ok, err)
				}
				defer unlock()
				if out, err := cli("retention", "run", "--org", "acme"); !errors.Is(err, retention.ErrBusy) {
					t.Fatalf("while a replica holds the org: %v\n%s", err, out)
				}
			})
		}

		t.Run("refused", func(t *testing.T) {
			for _, tc := range []struct {
				args []string
				err  string
			}{
				{[]string{"retention", "run", "--org", "acme", "--as-of", now.Add(48 * time.Hour).Format(time.RFC3339)}, "is later than now"},
				{[]string{"retention", "run", "--org", "acme", "--as-of", "yesterday"}, `--as-of "yesterday" is not a time`},
				{[]string{"retention", "run"}, "--org is required"},
				{[]string{"retention", "run", "--org", "nope"}, "nope"},
			} {
				if out, err := cli(tc.args...); err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("%v: error %v, want %q\n%s", tc.args, err, tc.err, out)
				}
			}
			if n := count("action:" + recordings.RetentionAction); n != 2 {
				t.Fatalf("%d retention.apply events after refused runs, want 2", n)
			}
		})
	})
}

func mustQuery(t *testing.T, q string) audit.Filter {
	t.Helper()
	f, err := audit.ParseQuery(q)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
