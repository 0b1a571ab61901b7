// Package retention applies each org's retention policy: audit events and
// command recordings older than the org's chosen number of days are
// removed, audit events only after they were archived (see audit.Expire),
// recordings leaving their command rows marked (see
// recordings.ExpireRecordings). The default keeps everything. A Runner
// applies the policies in a loop that is safe with several replicas: an
// advisory lock per org lets one replica work on an org at a time.
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/metrics"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Org settings (org_settings) holding the policy; absent means 0, keep
// everything.
const (
	settingAuditDays      = "retention.audit_days"
	settingRecordingsDays = "retention.recordings_days"
)

// MaxDays bounds a policy (about 100 years).
const MaxDays = 36500

// Policy is how many days each kind of data is kept; 0 keeps it forever.
type Policy struct {
	AuditDays      int `json:"audit_days"`
	RecordingsDays int `json:"recordings_days"`
}

// Validate says what is wrong with p, as field errors.
func (p Policy) Validate() error {
	v := apperr.Validation()
	if p.AuditDays < 0 || p.AuditDays > MaxDays {
		v.Add("audit_days", "audit_days must be from 0 (keep everything) to %d.", MaxDays)
	}
	if p.RecordingsDays < 0 || p.RecordingsDays > MaxDays {
		v.Add("recordings_days", "recordings_days must be from 0 (keep everything) to %d.", MaxDays)
	}
	return v.Err()
}

type orgSetting struct {
	Key   string `gorm:"primaryKey"`
	Value string
}

func (orgSetting) TableName() string { return "org_settings" }

// Load reads the org's policy.
func Load(ctx context.Context, db *gorm.DB) (Policy, error) {
	var rows []orgSetting
	if err := db.WithContext(ctx).Where("key IN ?", []string{settingAuditDays, settingRecordingsDays}).Find(&rows).Error; err != nil {
		return Policy{}, fmt.Errorf("read retention settings: %w", err)
	}
	var p Policy
	for _, r := range rows {
		n, _ := strconv.Atoi(r.Value)
		switch r.Key {
		case settingAuditDays:
			p.AuditDays = n
		case settingRecordingsDays:
			p.RecordingsDays = n
		}
	}
	return p, nil
}

// Save stores p inside the caller's transaction (with its audit record).
func Save(ctx context.Context, tx *gorm.DB, p Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	rows := []orgSetting{{Key: settingAuditDays, Value: strconv.Itoa(p.AuditDays)}, {Key: settingRecordingsDays, Value: strconv.Itoa(p.RecordingsDays)}}
	err := tx.WithContext(ctx).Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "key"}}, DoUpdates: clause.AssignmentColumns([]string{"value"})}).
		Create(&rows).Error
	if err != nil {
		return fmt.Errorf("save retention settings: %w", err)
	}
	return nil
}

// Result is what one application removed.
type Result struct {
	AuditRemoved      int64      `json:"audit_removed"`
	Archives          []int64    `json:"archives,omitempty"`
	ThroughSeq        int64      `json:"through_seq,omitempty"`
	ThroughHash       string     `json:"through_hash,omitempty"`
	RecordingsRemoved int64      `json:"recordings_removed"`
	AuditCutoff       *time.Time `json:"audit_cutoff,omitempty"`
	RecordingsCutoff  *time.Time `json:"recordings_cutoff,omitempty"`
}

// systemActor is who applies retention in the audit log.
func systemActor() audit.Actor { return audit.Actor{Type: audit.ActorSystem, Name: "retention"} }

// Apply applies p once at now: audit events are archived then removed,
// recordings removed, and, when anything was removed, the run is audited
// with its cutoffs, counts, archives and the new checkpoint. The event is
// appended after the removals, so it is part of the remaining chain.
func Apply(ctx context.Context, db *gorm.DB, log *audit.Log, p Policy, now time.Time) (Result, error) {
	return apply(ctx, db, log, p, now, now, systemActor())
}

// apply is Apply with the policy's cutoffs taken as of asOf (at most now,
// so it removes less), removed recordings marked at now, and the run
// audited as actor (an operator's `console retention run` names who ran it).
func apply(ctx context.Context, db *gorm.DB, log *audit.Log, p Policy, asOf, now time.Time, actor audit.Actor) (Result, error) {
	var res Result
	if p.AuditDays > 0 {
		cut := asOf.Add(-time.Duration(p.AuditDays) * 24 * time.Hour).UTC()
		res.AuditCutoff = &cut
		ex, err := log.Expire(ctx, cut)
		res.AuditRemoved, res.Archives, res.ThroughSeq, res.ThroughHash = ex.Removed, ex.Archives, ex.ThroughSeq, ex.ThroughHash
		if err != nil {
			return res, fmt.Errorf("audit retention: %w", err)
		}
		if res.AuditRemoved >= audit.CompactAfter {
			if err := log.Compact(ctx); err != nil {
				return res, err
			}
		}
	}
	if p.RecordingsDays > 0 {
		cut := asOf.Add(-time.Duration(p.RecordingsDays) * 24 * time.Hour).UTC()
		res.RecordingsCutoff = &cut
		n, err := recordings.ExpireRecordings(ctx, db, cut, now)
		res.RecordingsRemoved = n
		if err != nil {
			return res, fmt.Errorf("recording retention: %w", err)
		}
	}
	if res.AuditRemoved == 0 && res.RecordingsRemoved == 0 {
		return res, nil
	}
	_, err := log.Append(ctx, audit.Event{Actor: actor, Action: recordings.RetentionAction,
		Target:  audit.Target{Type: "organization_data"},
		Details: audit.Details(map[string]any{"policy": p, "result": res, "recordings_cutoff": res.RecordingsCutoff})})
	if err != nil {
		return res, fmt.Errorf("audit retention run: %w", err)
	}
	return res, nil
}

// OrgDeps is what the runner needs of one org.
type OrgDeps struct {
	DB      *gorm.DB
	Audit   *audit.Log
	Release func()
}

// Runner applies every active org's policy every Interval.
type Runner struct {
	ListOrgs func(ctx context.Context) ([]string, error)
	OpenOrg  func(ctx context.Context, slug string) (OrgDeps, error)
	Interval time.Duration
	Now      func() time.Time
	Logger   *slog.Logger
	Metrics  *metrics.Metrics
	// Actor names who applies the policy in the audit log; zero: the
	// system actor "retention".
	Actor audit.Actor
	// AsOf, when set, is the time the policy's cutoffs count back from
	// instead of Now (`console retention run --as-of`); removals are
	// still recorded at Now.
	AsOf time.Time
}

// Run applies the policies at start and every Interval until ctx ends.
func (r *Runner) Run(ctx context.Context) {
	if r.Interval <= 0 {
		r.Interval = time.Hour
	}
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		r.Round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Round applies every org's policy once; an org that fails is logged and
// retried next round.
func (r *Runner) Round(ctx context.Context) {
	slugs, err := r.ListOrgs(ctx)
	if err != nil {
		r.logger().Warn("retention: round skipped, orgs unreadable", "error", err)
		return
	}
	for _, slug := range slugs {
		if ctx.Err() != nil {
			return
		}
		if _, err := r.ApplyOrg(ctx, slug); err != nil && !errors.Is(err, ErrBusy) {
			r.logger().Warn("retention failed; retried next round", "org", slug, "error", err)
		}
	}
}

// ErrBusy is ApplyOrg's answer when another replica (or a `console
// retention run`) is applying the org's policy now.
var ErrBusy = errors.New("another console is applying this organization's retention policy now; try again shortly")

// Outcomes of one org's round, as logged and counted
// (gatehouse_retention_rounds_total{outcome}).
const (
	OutcomeRemoved = "removed" // something was removed (and audited)
	OutcomeNothing = "nothing" // a policy, but nothing older than it
	OutcomeKeepAll = "keep_all"
	OutcomeBusy    = "busy" // another replica holds the org's lock
	OutcomeError   = "error"
)

func lockKey(slug string) int64 { return store.LockKey("gatehouse-retention:" + slug) }

// ApplyOrg applies one org's policy unless another replica is doing it
// (ErrBusy). Every call leaves a trace whatever it did: a debug log line
// and a count per outcome, and the removed counts; a call that removed
// something is audited (retention.apply) and logged at info.
func (r *Runner) ApplyOrg(ctx context.Context, slug string) (res Result, err error) {
	var p Policy
	outcome := OutcomeError
	defer func() {
		r.Metrics.RetentionRound(slug, outcome)
		r.Metrics.RetentionRemoved(slug, "audit_events", res.AuditRemoved)
		r.Metrics.RetentionRemoved(slug, "recordings", res.RecordingsRemoved)
		attrs := []any{"org", slug, "outcome", outcome, "audit_days", p.AuditDays, "recordings_days", p.RecordingsDays,
			"audit_removed", res.AuditRemoved, "recordings_removed", res.RecordingsRemoved}
		if err != nil && outcome == OutcomeError {
			attrs = append(attrs, "error", err)
		}
		r.logger().Debug("retention round", attrs...)
		if res.AuditRemoved > 0 || res.RecordingsRemoved > 0 {
			r.logger().Info("retention applied", "org", slug, "audit_removed", res.AuditRemoved, "recordings_removed", res.RecordingsRemoved)
		}
	}()
	deps, err := r.OpenOrg(ctx, slug)
	if err != nil {
		return Result{}, err
	}
	defer deps.Release()
	unlock, ok, err := store.TryAdvisoryLock(ctx, deps.DB, lockKey(slug))
	if err != nil {
		return Result{}, err
	}
	if !ok {
		outcome = OutcomeBusy
		return Result{}, ErrBusy
	}
	defer unlock()
	if p, err = Load(ctx, deps.DB); err != nil {
		return Result{}, err
	}
	if p.AuditDays == 0 && p.RecordingsDays == 0 {
		outcome = OutcomeKeepAll
		return Result{}, nil
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	actor := r.Actor
	if actor == (audit.Actor{}) {
		actor = systemActor()
	}
	at := now()
	asOf := at
	if !r.AsOf.IsZero() && r.AsOf.Before(at) {
		asOf = r.AsOf
	}
	res, err = apply(ctx, deps.DB, deps.Audit, p, asOf, at, actor)
	switch {
	case err != nil:
	case res.AuditRemoved > 0 || res.RecordingsRemoved > 0:
		outcome = OutcomeRemoved
	default:
		outcome = OutcomeNothing
	}
	return res, err
}

func (r *Runner) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.Default()
}
