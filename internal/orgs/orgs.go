// Package orgs keeps the organization catalog and each organization's own
// deployment: its database (a Postgres database or a SQLite file), opened
// lazily as a pool, migrated on open, closed when idle, suspended or deleted.
//
// Isolation is structural: an org's rows live in a database only its handle
// can reach, so no query of one org can read another's.
package orgs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Statuses.
const (
	StatusActive    = "active"
	StatusSuspended = "suspended"
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
	// DataDir holds orgs/<slug>.db in the embedded (SQLite) mode.
	DataDir string
	// ServerDSN, when set, is a Postgres DSN on whose server org databases
	// are created (the catalog's own DSN in production).
	ServerDSN string
	// DBPrefix names created Postgres databases: <prefix><slug>.
	DBPrefix string
	// IdleClose closes an org pool unused for this long (default 10 min).
	IdleClose time.Duration
	Logger    *slog.Logger
	Now       func() time.Time
}

// Service manages organizations and their deployments.
type Service struct {
	cfg Config
	// createMu serializes provisioning so two creates of one slug cannot
	// both pass the existence checks before either holds the name.
	createMu sync.Mutex
	mu       sync.Mutex
	pools    map[string]*pool
	stop     chan struct{}
	done     chan struct{}
}

type pool struct {
	db       *gorm.DB
	refs     int
	lastUsed time.Time
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
	s := &Service{cfg: cfg, pools: map[string]*pool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go s.janitor()
	return s
}

// Close stops the janitor and closes every open org pool.
func (s *Service) Close() {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for slug, p := range s.pools {
		_ = store.Close(p.db)
		delete(s.pools, slug)
	}
}

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

// CreateInput is what an admin submits to create an org.
type CreateInput struct {
	Slug string
	Name string
	// AttachDSN optionally names an existing empty Postgres database to use
	// instead of creating one.
	AttachDSN string
}

func (s *Service) locatorAD(slug string) string {
	return sealed.AD("catalog", "organization/"+slug+"/db_locator")
}

// Create validates, provisions the org's database, migrates it and only
// then records the org in the catalog. Any failure undoes what was done,
// so nothing is half-created.
func (s *Service) Create(ctx context.Context, in CreateInput) (Org, error) {
	in.Slug = strings.TrimSpace(in.Slug)
	in.Name = strings.TrimSpace(in.Name)
	in.AttachDSN = strings.TrimSpace(in.AttachDSN)
	v := apperr.Validation()
	if msg := ValidateSlug(in.Slug); msg != "" {
		v.Add("slug", "%s", msg)
	}
	if in.Name == "" {
		in.Name = in.Slug
	}
	if len(in.Name) > 200 {
		v.Add("name", "Name must be at most 200 characters.")
	}
	if in.AttachDSN != "" && store.DialectOf(in.AttachDSN) != store.Postgres {
		v.Add("database_url", "An attached database must be a postgres:// URL.")
	}
	if in.AttachDSN != "" {
		if _, err := store.DatabaseName(in.AttachDSN); err != nil {
			v.Add("database_url", "The attached database URL must name a database, like postgres://user@host:5432/dbname.")
		}
	}
	if err := v.Err(); err != nil {
		return Org{}, err
	}

	s.createMu.Lock()
	defer s.createMu.Unlock()
	if _, err := s.Get(ctx, in.Slug); err == nil {
		return Org{}, slugTaken(in.Slug)
	} else if !errors.Is(err, apperr.ErrNotFound) {
		return Org{}, err
	}

	dsn, dialect, attached, undo, err := s.provision(ctx, in)
	if err != nil {
		return Org{}, err
	}
	fail := func(err error) (Org, error) {
		if uerr := undo(); uerr != nil {
			s.cfg.Logger.Error("undo org provisioning", "slug", in.Slug, "error", uerr)
		}
		return Org{}, err
	}
	db, err := store.Open(ctx, dsn, store.Options{})
	if err != nil {
		return fail(fmt.Errorf("open new org database: %w", err))
	}
	if attached {
		var n int64
		if err := db.Raw(tableCountSQL(dialect)).Scan(&n).Error; err != nil || n > 0 {
			_ = store.Close(db)
			return fail(apperr.New(apperr.ErrInvalid, "database_not_empty", "The attached database already has tables; attach an empty database."))
		}
	}
	if _, err := store.Migrate(ctx, db, store.OrgSet); err != nil {
		_ = store.Close(db)
		return fail(fmt.Errorf("migrate new org database: %w", err))
	}
	_ = store.Close(db)

	loc := dsn
	if dialect == store.SQLite {
		loc = s.sqliteRel(in.Slug)
	}
	sealedLoc, err := s.cfg.Box.Seal([]byte(loc), s.locatorAD(in.Slug))
	if err != nil {
		return fail(err)
	}
	now := s.cfg.Now().UTC()
	r := orgRow{Slug: in.Slug, Name: in.Name, Status: StatusActive, DBDialect: string(dialect), DBLocator: sealedLoc,
		DBAttached: attached, CreatedAt: now, UpdatedAt: now}
	if err := s.cfg.Catalog.WithContext(ctx).Create(&r).Error; err != nil {
		if store.IsUniqueViolation(err) {
			return fail(slugTaken(in.Slug))
		}
		return fail(fmt.Errorf("record org: %w", err))
	}
	return r.org(), nil
}

func slugTaken(slug string) error {
	return &apperr.ValidationError{Fields: map[string]string{"slug": fmt.Sprintf("The slug %q is already taken.", slug)}}
}

func tableCountSQL(d store.Dialect) string {
	if d == store.Postgres {
		return "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
	}
	return "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
}

func (s *Service) sqliteRel(slug string) string { return filepath.Join("orgs", slug+".db") }

// provision makes the org's empty database and returns how to undo it.
func (s *Service) provision(ctx context.Context, in CreateInput) (dsn string, d store.Dialect, attached bool, undo func() error, err error) {
	noop := func() error { return nil }
	if in.AttachDSN != "" {
		return in.AttachDSN, store.Postgres, true, noop, nil
	}
	if s.cfg.ServerDSN != "" {
		name := s.cfg.DBPrefix + strings.ReplaceAll(in.Slug, "-", "_")
		admin, err := store.Open(ctx, s.cfg.ServerDSN, store.Options{MaxOpenConns: 1})
		if err != nil {
			return "", "", false, nil, fmt.Errorf("connect to the database server: %w", err)
		}
		defer store.Close(admin)
		if err := admin.WithContext(ctx).Exec("CREATE DATABASE " + store.QuoteIdent(name)).Error; err != nil {
			if strings.Contains(err.Error(), "already exists") {
				// Someone else's database: never adopt or drop it.
				return "", "", false, nil, apperr.New(apperr.ErrConflict, "database_exists",
					"A database named %s already exists on the server; choose another slug or remove that database.", name)
			}
			return "", "", false, nil, fmt.Errorf("create org database: %w", err)
		}
		dsn, err := store.WithDatabase(s.cfg.ServerDSN, name)
		if err != nil {
			return "", "", false, nil, err
		}
		return dsn, store.Postgres, false, func() error { return s.dropPostgres(context.Background(), dsn) }, nil
	}
	path := filepath.Join(s.cfg.DataDir, s.sqliteRel(in.Slug))
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", "", false, nil, fmt.Errorf("create orgs dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", "", false, nil, apperr.New(apperr.ErrConflict, "database_exists",
				"A database file for %q already exists in the data directory; remove it or choose another slug.", in.Slug)
		}
		return "", "", false, nil, fmt.Errorf("create org database file: %w", err)
	}
	_ = f.Close()
	return path, store.SQLite, false, func() error { return removeSQLite(path) }, nil
}

func removeSQLite(path string) error {
	var first error
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) && first == nil {
			first = err
		}
	}
	return first
}

func (s *Service) dropPostgres(ctx context.Context, dsn string) error {
	name, err := store.DatabaseName(dsn)
	if err != nil {
		return err
	}
	maint, err := store.WithDatabase(dsn, "postgres")
	if err != nil {
		return err
	}
	admin, err := store.Open(ctx, maint, store.Options{MaxOpenConns: 1})
	if err != nil {
		return fmt.Errorf("connect to drop %s: %w", name, err)
	}
	defer store.Close(admin)
	if err := admin.WithContext(ctx).Exec("DROP DATABASE IF EXISTS " + store.QuoteIdent(name) + " WITH (FORCE)").Error; err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
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
		return nil, fmt.Errorf("list orgs: %w", err)
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
		return r, fmt.Errorf("read org %s: %w", slug, res.Error)
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
	if err := s.cfg.Catalog.WithContext(ctx).Model(&orgRow{}).Where("id = ?", r.ID).
		Updates(map[string]any{"name": r.Name, "updated_at": r.UpdatedAt}).Error; err != nil {
		return Org{}, Org{}, fmt.Errorf("update org: %w", err)
	}
	return before, r.org(), nil
}

// SetStatus suspends or resumes an org. Suspending closes its pool.
func (s *Service) SetStatus(ctx context.Context, slug, status string) (Org, error) {
	r, err := s.getRow(ctx, slug)
	if err != nil {
		return Org{}, err
	}
	if r.Status == status {
		return Org{}, apperr.New(apperr.ErrConflict, "status_unchanged", "Organization %q is already %s.", slug, status)
	}
	now := s.cfg.Now().UTC()
	updates := map[string]any{"status": status, "updated_at": now, "suspended_at": nil}
	if status == StatusSuspended {
		updates["suspended_at"] = now
	}
	if err := s.cfg.Catalog.WithContext(ctx).Model(&orgRow{}).Where("id = ?", r.ID).Updates(updates).Error; err != nil {
		return Org{}, fmt.Errorf("set org status: %w", err)
	}
	if status == StatusSuspended {
		s.closePool(slug)
	}
	return s.Get(ctx, slug)
}

// Delete removes the org's database (or file) and its catalog row. confirm
// must equal the slug: deletion is irreversible.
func (s *Service) Delete(ctx context.Context, slug, confirm string) (Org, error) {
	r, err := s.getRow(ctx, slug)
	if err != nil {
		return Org{}, err
	}
	if confirm != slug {
		return Org{}, &apperr.ValidationError{Fields: map[string]string{"confirm": fmt.Sprintf("Type the slug %q to confirm deletion.", slug)}}
	}
	s.closePool(slug)
	loc, err := s.cfg.Box.Open(r.DBLocator, s.locatorAD(slug))
	if err != nil {
		return Org{}, fmt.Errorf("open org locator: %w", err)
	}
	// Remove the data first: a catalog row left behind after a failed drop
	// can be deleted again; an orphaned database would be invisible.
	if store.Dialect(r.DBDialect) == store.Postgres {
		if err := s.dropPostgres(ctx, string(loc)); err != nil {
			return Org{}, err
		}
	} else if err := removeSQLite(filepath.Join(s.cfg.DataDir, string(loc))); err != nil {
		return Org{}, fmt.Errorf("remove org database file: %w", err)
	}
	if err := s.cfg.Catalog.WithContext(ctx).Delete(&orgRow{}, r.ID).Error; err != nil {
		return Org{}, fmt.Errorf("delete org row: %w", err)
	}
	return r.org(), nil
}

// Handle is an open org deployment. Release it when the request is done.
type Handle struct {
	Org Org
	DB  *gorm.DB
	s   *Service
}

// Release returns the handle; the pool may then be closed when idle.
func (h *Handle) Release() {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	if p := h.s.pools[h.Org.Slug]; p != nil && p.db == h.DB {
		p.refs--
		p.lastUsed = h.s.cfg.Now()
	}
}

// Open returns a handle on an active org's database, opening and migrating
// the pool on first use. A suspended org answers ErrSuspended.
func (s *Service) Open(ctx context.Context, slug string) (*Handle, error) {
	r, err := s.getRow(ctx, slug)
	if err != nil {
		return nil, err
	}
	o := r.org()
	if o.Status == StatusSuspended {
		return nil, apperr.New(apperr.ErrSuspended, "org_suspended", "Organization %q is suspended; contact your platform administrator.", slug)
	}
	s.mu.Lock()
	if p := s.pools[slug]; p != nil {
		p.refs++
		p.lastUsed = s.cfg.Now()
		s.mu.Unlock()
		return &Handle{Org: o, DB: p.db, s: s}, nil
	}
	s.mu.Unlock()

	db, err := s.openRow(ctx, r)
	if err != nil {
		return nil, err
	}
	// Upgrades bring new org migrations; apply them on first open.
	if _, err := store.Migrate(ctx, db, store.OrgSet); err != nil {
		_ = store.Close(db)
		return nil, fmt.Errorf("migrate org %s: %w", slug, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pools[slug]; p != nil { // lost a race: use the winner's pool
		_ = store.Close(db)
		p.refs++
		return &Handle{Org: o, DB: p.db, s: s}, nil
	}
	s.pools[slug] = &pool{db: db, refs: 1, lastUsed: s.cfg.Now()}
	return &Handle{Org: o, DB: db, s: s}, nil
}

// OpenPools reports how many org pools are open (for readiness and tests).
func (s *Service) OpenPools() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pools)
}

func (s *Service) closePool(slug string) {
	s.mu.Lock()
	p := s.pools[slug]
	delete(s.pools, slug)
	s.mu.Unlock()
	if p != nil {
		_ = store.Close(p.db)
	}
}

func (s *Service) janitor() {
	defer close(s.done)
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.CloseIdle()
		}
	}
}

// CloseIdle closes pools nobody holds that were unused for IdleClose.
func (s *Service) CloseIdle() int {
	s.mu.Lock()
	var idle []*pool
	now := s.cfg.Now()
	for slug, p := range s.pools {
		if p.refs <= 0 && now.Sub(p.lastUsed) >= s.cfg.IdleClose {
			idle = append(idle, p)
			delete(s.pools, slug)
		}
	}
	s.mu.Unlock()
	for _, p := range idle {
		_ = store.Close(p.db)
	}
	return len(idle)
}

// MigrateOrg applies pending org migrations to one org's database, whether
// or not it is suspended (used by `console migrate`).
func (s *Service) MigrateOrg(ctx context.Context, slug string) error {
	r, err := s.getRow(ctx, slug)
	if err != nil {
		return err
	}
	db, err := s.openRow(ctx, r)
	if err != nil {
		return err
	}
	defer store.Close(db)
	_, err = store.Migrate(ctx, db, store.OrgSet)
	return err
}

// openRow opens a fresh (unpooled) handle on an org's database.
func (s *Service) openRow(ctx context.Context, r orgRow) (*gorm.DB, error) {
	loc, err := s.cfg.Box.Open(r.DBLocator, s.locatorAD(r.Slug))
	if err != nil {
		return nil, fmt.Errorf("open org locator: %w", err)
	}
	dsn := string(loc)
	if store.Dialect(r.DBDialect) == store.SQLite {
		dsn = filepath.Join(s.cfg.DataDir, dsn)
	}
	db, err := store.Open(ctx, dsn, store.Options{})
	if err != nil {
		return nil, fmt.Errorf("open org %s database: %w", r.Slug, err)
	}
	return db, nil
}
