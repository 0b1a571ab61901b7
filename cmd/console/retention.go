package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/retention"
	"github.com/gatehouse/gatehouse/internal/store"
)

const retentionUsage = "usage: console retention run --org <slug> [--as-of <time>]"

// retentionCmd runs `console retention run --org <slug> [--as-of TIME]`:
// one round of the org's retention policy, as the loop applies it (same
// lock, so it waits for no replica and never runs beside one), audited
// under the OS user who ran it. --as-of applies the policy as of an
// earlier time, removing less; it cannot be later than now, which would
// remove what the policy still keeps.
func retentionCmd(ctx context.Context, cfg config.Config, logger *slog.Logger, args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "run" {
		return errors.New(retentionUsage)
	}
	fs := flag.NewFlagSet("console retention run", flag.ContinueOnError)
	fs.SetOutput(stdout)
	slug := fs.String("org", "", "apply the retention policy of the organization with this slug")
	asOf := fs.String("as-of", "", "apply the policy as of this time (RFC 3339, e.g. 2026-05-01T12:00:00Z, or a date 2026-05-01; default now; not later than now)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q; %s", fs.Arg(0), retentionUsage)
	}
	if *slug == "" {
		return fmt.Errorf("--org is required; %s", retentionUsage)
	}
	now := time.Now().UTC()
	at, err := parseAsOf(*asOf, now)
	if err != nil {
		return err
	}

	box, err := console.LoadMasterKey(cfg)
	if err != nil {
		return err
	}
	cat, err := console.OpenCatalog(ctx, cfg)
	if err != nil {
		return err
	}
	defer store.Close(cat)
	svc := orgs.New(orgs.Config{Catalog: cat, Box: box, DataDir: cfg.DataDir, DBPrefix: cfg.OrgDBPrefix,
		ServerDSN: cfg.DatabaseURL, Logger: logger})
	defer svc.Close()
	open := func(ctx context.Context, slug string) (retention.OrgDeps, error) {
		h, err := svc.Open(ctx, slug)
		if errors.Is(err, apperr.ErrSuspended) {
			return retention.OrgDeps{}, fmt.Errorf("organization %q is suspended and its database is closed; retention applies to active organizations", slug)
		}
		if err != nil {
			return retention.OrgDeps{}, err
		}
		return retention.OrgDeps{DB: h.DB, Audit: audit.NewLog(h.DB, audit.OrgTable, nil), Release: h.Release}, nil
	}
	deps, err := open(ctx, *slug)
	if err != nil {
		return err
	}
	policy, err := retention.Load(ctx, deps.DB)
	deps.Release()
	if err != nil {
		return err
	}
	r := &retention.Runner{OpenOrg: open, AsOf: at, Logger: logger,
		Actor: audit.Actor{Type: audit.ActorSystem, Name: "console retention run (OS user " + osUser() + ")"}}
	res, err := r.ApplyOrg(ctx, *slug)
	if err != nil {
		return fmt.Errorf("retention of organization %q: %w", *slug, err)
	}
	printRetention(stdout, *slug, policy, at, res)
	return nil
}

// parseAsOf reads --as-of: RFC 3339 or a date (midnight UTC); empty is now.
func parseAsOf(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return now, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		if t, err = time.Parse(time.DateOnly, s); err != nil {
			return time.Time{}, fmt.Errorf("--as-of %q is not a time: give RFC 3339 (2026-05-01T12:00:00Z) or a date (2026-05-01)", s)
		}
	}
	if t.After(now) {
		return time.Time{}, fmt.Errorf("--as-of %s is later than now: the policy would remove what it still keeps", t.UTC().Format(time.RFC3339))
	}
	return t.UTC(), nil
}

// printRetention says what one run did.
func printRetention(w io.Writer, slug string, p retention.Policy, at time.Time, res retention.Result) {
	if p.AuditDays == 0 && p.RecordingsDays == 0 {
		fmt.Fprintf(w, "Organization %q keeps everything (no retention policy): nothing removed.\n", slug)
		return
	}
	fmt.Fprintf(w, "Organization %q, policy %s, applied as of %s:\n", slug, describePolicy(p), at.Format(time.RFC3339))
	if res.AuditCutoff != nil {
		fmt.Fprintf(w, "  audit events before %s: %d removed", res.AuditCutoff.Format(time.RFC3339), res.AuditRemoved)
		if res.AuditRemoved > 0 {
			ids := make([]string, len(res.Archives))
			for i, id := range res.Archives {
				ids[i] = fmt.Sprint(id)
			}
			fmt.Fprintf(w, " (archives %s; the chain now starts after event %d)", strings.Join(ids, ", "), res.ThroughSeq)
		}
		fmt.Fprintln(w)
	}
	if res.RecordingsCutoff != nil {
		fmt.Fprintf(w, "  recordings of commands that ended before %s: %d removed (the command rows stay)\n",
			res.RecordingsCutoff.Format(time.RFC3339), res.RecordingsRemoved)
	}
	if res.AuditRemoved > 0 || res.RecordingsRemoved > 0 {
		fmt.Fprintf(w, "Recorded in the organization's audit log as %s.\n", recordings.RetentionAction)
	} else {
		fmt.Fprintln(w, "Nothing was older than the policy; nothing removed, nothing audited.")
	}
}

func describePolicy(p retention.Policy) string {
	days := func(n int, what string) string {
		if n == 0 {
			return what + " kept forever"
		}
		return fmt.Sprintf("%s %d days", what, n)
	}
	return days(p.AuditDays, "audit events") + ", " + days(p.RecordingsDays, "recordings")
}
