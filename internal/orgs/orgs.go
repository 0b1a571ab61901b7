// Package orgs keeps the organization catalog and each organization's own
// deployment: its database (a Postgres database or a SQLite file), opened
// lazily as a pool, migrated on open, closed when idle, suspended or deleted.
//
// Isolation is structural: an org's rows live in a database only its handle
// can reach, so no query of one org can read another's.
//
// Creating and deleting an org are recorded processes: the catalog row
// (status provisioning or deleting, with the progress made) is written
// before any side effect, so a crash at any point leaves a row that says
// what to finish or undo, and Reconcile does it.
package orgs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Statuses. Only active and suspended orgs exist for their users; the other
// two mark a creation or deletion under way (or interrupted).
const (
	StatusProvisioning = "provisioning"
	StatusActive       = "active"
	StatusSuspended    = "suspended"
	StatusDeleting     = "deleting"
)

// Org is an organization as the rest of the program sees it. The database
// locator is deliberately absent: it can hold credentials.
type Org struct {
	ID          int64
	Slug        string
	Name        string
	Status      string
	Dialect     store.Dialect
	Attached    bool
	CreatedAt   time.Time
	UpdatedAt   time.Time
	SuspendedAt *time.Time
}

type orgRow struct {
	ID          int64 `gorm:"primaryKey"`
	Slug        string
	Name        string
	Status      string
	DBDialect   string `gorm:"column:db_dialect"`
	DBLocator   string `gorm:"column:db_locator"`
	DBAttached  bool   `gorm:"column:db_attached"`
	CreatedAt   time.Time
	UpdatedAt   time.Time
	SuspendedAt *time.Time
	// Progress says how far a provisioning org got (see progress*).
	Progress string `gorm:"column:provision_progress"`
}

func (orgRow) TableName() string { return "organizations" }

func (r orgRow) org() Org {
	return Org{ID: r.ID, Slug: r.Slug, Name: r.Name, Status: r.Status, Dialect: store.Dialect(r.DBDialect),
		Attached: r.DBAttached, CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(), SuspendedAt: r.SuspendedAt}
}

// Config wires a Service.
type Config struct {
	Catalog *gorm.DB
	Box     *sealed.Box
	// Audit is the platform audit log (on Catalog). Creations and deletions
	// commit with their records; the reconciler records every action.
	// Default: a log on Catalog's platform table.
	Audit *audit.Log
	// DataDir holds orgs/<slug>.db in the embedded (SQLite) mode.
	DataDir string
	// ServerDSN, when set, is a Postgres DSN on whose server org databases
	// are created (the catalog's own DSN in production).
	ServerDSN string
	// DBPrefix names created Postgres databases: <prefix><slug>.
	DBPrefix string
	// IdleClose closes an org pool unused for this long (default 10 min).
	IdleClose time.Duration
	// Parallel bounds concurrent creations and deletions (default 4): each
	// holds a catalog connection for its lock and needs another for its
	// work, so unbounded they could exhaust the catalog pool.
	Parallel int
	Logger   *slog.Logger
	Now      func() time.Time
}

// Service manages organizations and their deployments.
type Service struct {
	cfg Config
	// work bounds concurrent provisioning; see Config.Parallel.
	work chan struct{}
	// reconciling keeps one reconciler round per process.
	reconciling sync.Mutex
	mu          sync.Mutex
	pools       map[string]*pool
	// busy holds slugs a create, delete or reconcile of this process is
	// working on; the Postgres advisory lock does it across replicas.
	busy map[string]bool
	// gen counts revocations per slug, so an Open racing a suspend cannot
	// install a pool after the revocation.
	gen map[string]uint64
	// draining holds revoked pools still held by requests.
	draining map[*pool]bool
	stop     chan struct{}
	done     chan struct{}
}

// New returns a Service and starts its idle-pool janitor; call Close.
func New(cfg Config) *Service {
	if cfg.IdleClose == 0 {
		cfg.IdleClose = 10 * time.Minute
	}
	if cfg.DBPrefix == "" {
		cfg.DBPrefix = "gatehouse_org_"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Audit == nil {
		cfg.Audit = audit.NewLog(cfg.Catalog, audit.PlatformTable, nil)
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 4
	}
	s := &Service{cfg: cfg, work: make(chan struct{}, cfg.Parallel), pools: map[string]*pool{},
		busy: map[string]bool{}, gen: map[string]uint64{}, draining: map[*pool]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go s.janitor()
	return s
}

// Close stops the janitor and revokes every open org pool; pools still held
// close when released.
func (s *Service) Close() {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	slugs := make([]string, 0, len(s.pools))
	for slug := range s.pools {
		slugs = append(slugs, slug)
	}
	s.mu.Unlock()
	for _, slug := range slugs {
		s.revoke(slug, errClosed)
	}
}

var errClosed = apperr.New(apperr.ErrUnavailable, "shutting_down", "The console is shutting down; try again shortly.")

var slugRE = regexp.MustCompile(`^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$`)

// reservedSlugs would collide with routes or be confusing in URLs.
var reservedSlugs = map[string]bool{"new": true, "admin": true, "api": true, "static": true, "login": true, "logout": true}

// ValidateSlug explains what is wrong with slug, or returns "".
func ValidateSlug(slug string) string {
	switch {
	case len(slug) < 3 || len(slug) > 40:
		return "Slug must be 3 to 40 characters long."
	case !slugRE.MatchString(slug):
		return "Slug may contain only lowercase letters, digits and dashes, and must start and end with a letter or digit."
	case strings.Contains(slug, "--"):
		return "Slug may not contain two dashes in a row."
	case reservedSlugs[slug]:
		return fmt.Sprintf("%q is reserved; choose another slug.", slug)
	}
	return ""
}

// List returns orgs ordered by slug, after the given slug (keyset paging),
// at most limit (0 = all).
func (s *Service) List(ctx context.Context, after string, limit int) ([]Org, error) {
	var rows []orgRow
	q := s.cfg.Catalog.WithContext(ctx).Order("slug")
	if after != "" {
		q = q.Where("slug > ?", after)
	}
	if limit > 0 {
		q = q.Limit(limit)
	}
	if err := q.Find(&rows).Error; err != nil {
		return nil, catalogErr(fmt.Errorf("list orgs: %w", err))
	}
	out := make([]Org, len(rows))
	for i, r := range rows {
		out[i] = r.org()
	}
	return out, nil
}

func (s *Service) getRow(ctx context.Context, slug string) (orgRow, error) {
	var r orgRow
	res := s.cfg.Catalog.WithContext(ctx).Where("slug = ?", slug).Limit(1).Find(&r)
	if res.Error != nil {
		return r, catalogErr(fmt.Errorf("read org %s: %w", slug, res.Error))
	}
	if res.RowsAffected == 0 {
		return r, apperr.New(apperr.ErrNotFound, "org_not_found", "No organization has the slug %q.", slug)
	}
	return r, nil
}

// Get returns one org by slug.
func (s *Service) Get(ctx context.Context, slug string) (Org, error) {
	r, err := s.getRow(ctx, slug)
	if err != nil {
		return Org{}, err
	}
	return r.org(), nil
}

// UpdateInput holds editable fields; nil means unchanged.
type UpdateInput struct {
	Name *string
}

// Update changes an org's editable fields and returns before and after.
func (s *Service) Update(ctx context.Context, slug string, in UpdateInput) (before, after Org, err error) {
	r, err := s.getRow(ctx, slug)
	if err != nil {
		return Org{}, Org{}, err
	}
	before = r.org()
	if in.Name != nil {
		name := strings.TrimSpace(*in.Name)
		if name == "" || len(name) > 200 {
			return Org{}, Org{}, &apperr.ValidationError{Fields: map[string]string{"name": "Name must be 1 to 200 characters."}}
		}
		r.Name = name
	}
	r.UpdatedAt = s.cfg.Now().UTC()
	if err := settled(r); err != nil {
		return Org{}, Org{}, err
	}
	if err := s.cfg.Catalog.WithContext(ctx).Model(&orgRow{}).Where("id = ?", r.ID).
		Updates(map[string]any{"name": r.Name, "updated_at": r.UpdatedAt}).Error; err != nil {
		return Org{}, Org{}, catalogErr(fmt.Errorf("update org: %w", err))
	}
	s.mu.Lock()
	if p := s.pools[slug]; p != nil {
		p.checked = time.Time{} // the next request reads the new name
	}
	s.mu.Unlock()
	return before, r.org(), nil
}

// SetStatus suspends or resumes an org. Suspending revokes its pool: the
// org's in-flight requests see their tenant context end at once.
func (s *Service) SetStatus(ctx context.Context, slug, status string) (Org, error) {
	return s.SetStatusAudited(ctx, slug, status, nil)
}

// SetStatusAudited is SetStatus whose platform audit record (event, when
// set, given the org as changed) commits in the same catalog transaction
// as the change: the two succeed or fail together.
func (s *Service) SetStatusAudited(ctx context.Context, slug, status string, event func(Org) audit.Event) (Org, error) {
	r, err := s.getRow(ctx, slug)
	if err != nil {
		return Org{}, err
	}
	if r.Status == status {
		return Org{}, apperr.New(apperr.ErrConflict, "status_unchanged", "Organization %q is already %s.", slug, status)
	}
	if err := settled(r); err != nil {
		return Org{}, err
	}
	now := s.cfg.Now().UTC()
	updates := map[string]any{"status": status, "updated_at": now, "suspended_at": nil}
	r.Status, r.UpdatedAt, r.SuspendedAt = status, now, nil
	if status == StatusSuspended {
		updates["suspended_at"] = now
		r.SuspendedAt = &now
	}
	changed := true
	err = s.cfg.Catalog.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Only a settled org changes status: a deletion that began
		// meanwhile must not be turned back into a live org.
		res := tx.Model(&orgRow{}).Where("id = ? AND status IN ?", r.ID, []string{StatusActive, StatusSuspended}).Updates(updates)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			changed = false
			return nil
		}
		if event != nil {
			if _, err := s.cfg.Audit.AppendTx(ctx, tx, event(r.org())); err != nil {
				return fmt.Errorf("record: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return Org{}, catalogErr(fmt.Errorf("set org status: %w", err))
	}
	if !changed {
		return Org{}, orgBusy(slug)
	}
	if status == StatusSuspended {
		s.revoke(slug, suspendedErr(slug))
	}
	return s.Get(ctx, slug)
}

// settled refuses changes to an org whose creation or deletion is under way.
func settled(r orgRow) error {
	switch r.Status {
	case StatusProvisioning:
		return apperr.New(apperr.ErrConflict, "org_provisioning", "Organization %q is still being created; try again shortly.", r.Slug)
	case StatusDeleting:
		return apperr.New(apperr.ErrConflict, "org_deleting", "Organization %q is being deleted.", r.Slug)
	}
	return nil
}

func orgBusy(slug string) error {
	return apperr.New(apperr.ErrConflict, "org_busy", "Organization %q is being changed by another request; try again shortly.", slug)
}

func suspendedErr(slug string) error {
	return apperr.New(apperr.ErrSuspended, "org_suspended", "Organization %q is suspended; contact your platform administrator.", slug)
}

// UnavailableError says that a database could not be reached, and which:
// "catalog" or "org <slug>". It matches apperr.ErrUnavailable.
type UnavailableError struct {
	Database string
	Err      error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("%s database unavailable: %v", e.Database, e.Err)
}

// Unwrap exposes both the kind and the cause.
func (e *UnavailableError) Unwrap() []error { return []error{apperr.ErrUnavailable, e.Err} }

// markUnavailable wraps err as an outage of database when it is one.
func markUnavailable(database string, err error) error {
	var ue *UnavailableError
	if err == nil || errors.As(err, &ue) || !store.IsUnavailable(err) {
		return err
	}
	return &UnavailableError{Database: database, Err: err}
}

func catalogErr(err error) error { return markUnavailable("catalog", err) }

func orgDBErr(slug string, err error) error { return markUnavailable("org "+slug, err) }
