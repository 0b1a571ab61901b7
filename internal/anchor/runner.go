package anchor

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Interval is how often the console checkpoints every org's head.
const Interval = time.Minute

// roundLockKey lets one replica run a round at a time; the others skip
// theirs (Take is safe without it: this only saves their reads).
var roundLockKey = store.LockKey("gatehouse-audit-anchor-round")

// OrgDeps is what a round needs of one org.
type OrgDeps struct {
	Org     orgs.Org
	Audit   *audit.Log
	Release func()
}

// Stats is what one round did.
type Stats struct {
	// Skipped is set when another replica was running a round.
	Skipped   bool
	Orgs      int
	Written   int
	Unchanged int
	// Mismatched counts orgs whose log no longer holds their newest
	// checkpoint (Result.Mismatch) and orgs whose newest kept checkpoint
	// does not verify or is older than the newest the platform log
	// recorded (Result.Forged): logged as errors, told to Mismatch and
	// recorded as MismatchAction; verify names the missing events or the
	// tampered checkpoints.
	Mismatched int
	Failed     int
}

// MismatchAction is the platform audit action recording that a round
// found an org's log not holding its newest checkpoint (kind "log"), or
// that checkpoint not verifying or older than the newest recorded (kind
// "checkpoint"). It is written when what was found changes, not every
// round.
const MismatchAction = "audit.checkpoint_mismatch"

// Runner checkpoints every active org's head on each tick.
type Runner struct {
	Anchors  *Service
	ListOrgs func(ctx context.Context) ([]string, error)
	OpenOrg  func(ctx context.Context, slug string) (OrgDeps, error)
	Logger   *slog.Logger
	// Mismatch, when set, is told of each round's mismatch by org and
	// kind ("log" or "checkpoint"): the console counts them in a metric.
	Mismatch func(org, kind string)
	// Stats, when set, receives every round's stats (tests wait on it).
	Stats chan<- Stats

	// reported is each org's last mismatch written to the platform log,
	// so a lasting one is recorded once, not every round (per process:
	// another replica taking over the rounds records it once more).
	mu       sync.Mutex
	reported map[string]string
}

// Run runs a round at start and one per tick until ctx ends.
func (r *Runner) Run(ctx context.Context, tick <-chan time.Time) {
	for {
		st := r.Round(ctx)
		if r.Stats != nil {
			select {
			case r.Stats <- st:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
	}
}

// Round checkpoints each active org whose head moved; an org that fails
// is logged and tried again next round.
func (r *Runner) Round(ctx context.Context) Stats {
	var st Stats
	unlock, ok, err := store.TryAdvisoryLock(ctx, r.Anchors.Catalog, roundLockKey)
	if err != nil {
		r.logger().Warn("audit checkpoints: round skipped, catalog unavailable", "error", err)
		st.Failed++
		return st
	}
	if !ok {
		st.Skipped = true
		return st
	}
	defer unlock()
	slugs, err := r.ListOrgs(ctx)
	if err != nil {
		r.logger().Warn("audit checkpoints: round skipped, orgs unreadable", "error", err)
		st.Failed++
		return st
	}
	for _, slug := range slugs {
		if ctx.Err() != nil {
			return st
		}
		st.Orgs++
		res, err := r.takeOrg(ctx, slug)
		switch {
		case err != nil:
			st.Failed++
			r.logger().Warn("audit checkpoint failed; retried next round", "org", slug, "error", err)
		case res.Forged != nil:
			st.Mismatched++
			r.logger().Error("the newest audit checkpoint does not verify or a newer one was deleted; no newer checkpoint is taken until it is repaired",
				"org", slug, "checkpoint_seq", res.Forged.FromSeq, "reason", res.Forged.Reason)
			r.mismatch(ctx, slug, "checkpoint", res.Forged.Reason, map[string]any{"checkpoint_seq": res.Forged.FromSeq})
		case res.Mismatch != nil:
			st.Mismatched++
			r.logger().Error("audit log no longer holds its newest checkpoint; no newer checkpoint is taken until it does",
				"org", slug, "checkpoint_seq", res.Mismatch.Anchor.Seq, "head_seq", res.Mismatch.HeadSeq, "reason", res.Mismatch.Reason)
			r.mismatch(ctx, slug, "log", res.Mismatch.Reason, map[string]any{"checkpoint_seq": res.Mismatch.Anchor.Seq,
				"head_seq": res.Mismatch.HeadSeq, "missing_from": res.Mismatch.MissingFrom, "missing_through": res.Mismatch.MissingThrough})
		case res.Written:
			st.Written++
			r.cleared(slug)
		default:
			st.Unchanged++
			r.cleared(slug)
		}
	}
	return st
}

// mismatch reports what a round found to the metric, and to the platform
// audit log when it differs from what was last recorded for slug.
func (r *Runner) mismatch(ctx context.Context, slug, kind, reason string, details map[string]any) {
	if r.Mismatch != nil {
		r.Mismatch(slug, kind)
	}
	r.mu.Lock()
	same := r.reported[slug] == kind+": "+reason
	r.mu.Unlock()
	if same || r.Anchors.Audit == nil {
		return
	}
	details["kind"], details["reason"] = kind, reason
	_, err := r.Anchors.Audit.Append(ctx, audit.Event{
		Actor:    audit.Actor{Type: audit.ActorSystem, Name: "audit-checkpoint"},
		Action:   MismatchAction,
		Target:   audit.Target{Type: "organization", ID: slug},
		Decision: audit.Deny,
		Details:  audit.Details(details),
	})
	if err != nil {
		r.logger().Warn("audit checkpoint mismatch not recorded; retried next round", "org", slug, "error", err)
		return
	}
	r.mu.Lock()
	if r.reported == nil {
		r.reported = map[string]string{}
	}
	r.reported[slug] = kind + ": " + reason
	r.mu.Unlock()
}

// cleared forgets slug's recorded mismatch once its log and checkpoint
// agree again, so a new one is recorded.
func (r *Runner) cleared(slug string) {
	r.mu.Lock()
	delete(r.reported, slug)
	r.mu.Unlock()
}

func (r *Runner) takeOrg(ctx context.Context, slug string) (Result, error) {
	d, err := r.OpenOrg(ctx, slug)
	if err != nil {
		return Result{}, err
	}
	defer d.Release()
	return r.Anchors.Take(ctx, d.Org, d.Audit)
}

func (r *Runner) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.Default()
	}
	return r.Logger
}
