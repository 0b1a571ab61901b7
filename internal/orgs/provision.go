package orgs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Provisioning progress, recorded in the row before the step it permits:
//
//   - progressClaimed: the row exists; nothing was created or touched.
//   - progressOwned: the database name (or file) was free when the slug was
//     claimed, so whatever exists under it now is this org's to drop.
//   - progressVerified: an attached database was found empty; migrations
//     may have run in it, and finishing them is safe.
const (
	progressClaimed  = "claimed"
	progressOwned    = "owned"
	progressVerified = "verified"
)

// CreateInput is what an admin submits to create an org.
type CreateInput struct {
	Slug string
	Name string
	// AttachDSN optionally names an existing empty Postgres database to use
	// instead of creating one.
	AttachDSN string
	// Event, when set, is the platform audit record of the creation: it
	// commits in the same transaction that makes the org active.
	Event func(Org) audit.Event
	// OrgEvent, when set, opens the org's own audit log; it is written
	// into the new database before the org becomes active.
	OrgEvent func(Org) audit.Event
}

// target is where an org's data lives.
type target struct {
	dsn      string // what to connect to (an absolute path for SQLite)
	loc      string // what the catalog keeps (a data-dir relative path for SQLite)
	dialect  store.Dialect
	attached bool
}

func (s *Service) locatorAD(slug string) string {
	return sealed.AD("catalog", "organization/"+slug+"/db_locator")
}

func (s *Service) sqliteRel(slug string) string { return filepath.Join("orgs", slug+".db") }

func (s *Service) pgName(slug string) string {
	return s.cfg.DBPrefix + strings.ReplaceAll(slug, "-", "_")
}

// locate opens an org row's sealed locator.
func (s *Service) locate(r orgRow) (target, error) {
	loc, err := s.cfg.Box.Open(r.DBLocator, s.locatorAD(r.Slug))
	if err != nil {
		return target{}, fmt.Errorf("open org %s locator: %w", r.Slug, err)
	}
	t := target{dsn: string(loc), loc: string(loc), dialect: store.Dialect(r.DBDialect), attached: r.DBAttached}
	if t.dialect == store.SQLite {
		t.dsn = filepath.Join(s.cfg.DataDir, t.loc)
	}
	return t, nil
}

// Create validates, records the org as provisioning, creates and migrates
// its database and only then makes it active. A failure undoes what was
// done; a crash leaves a row Reconcile finishes.
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

	l, err := s.lockOrg(ctx, in.Slug, 0)
	if err != nil {
		return Org{}, err
	}
	defer l.release()
	if r, err := s.getRow(ctx, in.Slug); err == nil {
		if err := settled(r); err != nil {
			return Org{}, err
		}
		return Org{}, slugTaken(in.Slug)
	} else if !errors.Is(err, apperr.ErrNotFound) {
		return Org{}, err
	}
	t, err := s.newTarget(ctx, l, in)
	if err != nil {
		return Org{}, err
	}
	r, err := s.claim(ctx, in, t)
	if err != nil {
		return Org{}, err
	}
	o, err := s.build(ctx, l, &r, t, in)
	if err != nil {
		// Undo even if the caller gave up; what cannot be undone now stays
		// recorded for the reconciler.
		if uerr := s.rollback(context.WithoutCancel(ctx), l, r, t, nil); uerr != nil {
			s.cfg.Logger.Error("undo org provisioning; the reconciler will retry", "org", in.Slug, "error", uerr)
		}
		return Org{}, err
	}
	return o, nil
}

func slugTaken(slug string) error {
	return &apperr.ValidationError{Fields: map[string]string{"slug": fmt.Sprintf("The slug %q is already taken.", slug)}}
}

func databaseExists(what string) error {
	return apperr.New(apperr.ErrConflict, "database_exists",
		"%s already exists but belongs to no organization; a platform admin can remove it under \"Unclaimed databases\" on the Organizations page, or choose another slug.", what)
}

// newTarget decides where the org's data goes and checks the name is free.
func (s *Service) newTarget(ctx context.Context, l *orgLock, in CreateInput) (target, error) {
	if in.AttachDSN != "" {
		return target{dsn: in.AttachDSN, loc: in.AttachDSN, dialect: store.Postgres, attached: true}, nil
	}
	if s.cfg.ServerDSN != "" {
		name := s.pgName(in.Slug)
		dsn, err := store.WithDatabase(s.cfg.ServerDSN, name)
		if err != nil {
			return target{}, err
		}
		taken, err := l.has(ctx, name)
		if err != nil {
			return target{}, err
		}
		if taken {
			// Someone else's (or an unfinished past's): never adopt it.
			return target{}, databaseExists("A database named " + name)
		}
		return target{dsn: dsn, loc: dsn, dialect: store.Postgres}, nil
	}
	rel := s.sqliteRel(in.Slug)
	path := filepath.Join(s.cfg.DataDir, rel)
	for _, p := range sqliteFiles(path) {
		if _, err := os.Lstat(p); err == nil {
			return target{}, databaseExists("A database file for " + in.Slug)
		} else if !errors.Is(err, os.ErrNotExist) {
			return target{}, fmt.Errorf("check org database file: %w", err)
		}
	}
	return target{dsn: path, loc: rel, dialect: store.SQLite}, nil
}

// claim records the org as provisioning: the intent, before any effect.
func (s *Service) claim(ctx context.Context, in CreateInput, t target) (orgRow, error) {
	sealedLoc, err := s.cfg.Box.Seal([]byte(t.loc), s.locatorAD(in.Slug))
	if err != nil {
		return orgRow{}, err
	}
	progress := progressOwned
	if t.attached {
		progress = progressClaimed
	}
	now := s.cfg.Now().UTC()
	r := orgRow{Slug: in.Slug, Name: in.Name, Status: StatusProvisioning, DBDialect: string(t.dialect), DBLocator: sealedLoc,
		DBAttached: t.attached, CreatedAt: now, UpdatedAt: now, Progress: progress}
	if err := s.cfg.Catalog.WithContext(ctx).Create(&r).Error; err != nil {
		if store.IsUniqueViolation(err) {
			return orgRow{}, slugTaken(in.Slug)
		}
		return orgRow{}, catalogErr(fmt.Errorf("record org: %w", err))
	}
	return r, nil
}

// build creates (or verifies), migrates and activates a claimed org.
func (s *Service) build(ctx context.Context, l *orgLock, r *orgRow, t target, in CreateInput) (Org, error) {
	if !t.attached {
		if err := s.createDatabase(ctx, l, t); err != nil {
			if errors.Is(err, os.ErrExist) || strings.Contains(err.Error(), "already exists") {
				// Created by someone else since the check: not ours to drop.
				r.Progress = progressClaimed
				return Org{}, databaseExists("A database for " + r.Slug)
			}
			return Org{}, err
		}
	}
	db, err := store.Open(ctx, t.dsn, store.Options{MaxOpenConns: 2})
	if err != nil {
		return Org{}, orgDBErr(r.Slug, fmt.Errorf("open new org database: %w", err))
	}
	defer store.Close(db)
	if t.attached {
		var n int64
		if err := db.WithContext(ctx).Raw(tableCountSQL(t.dialect)).Scan(&n).Error; err != nil {
			return Org{}, orgDBErr(r.Slug, fmt.Errorf("inspect attached database: %w", err))
		}
		if n > 0 {
			return Org{}, apperr.New(apperr.ErrInvalid, "database_not_empty", "The attached database already has tables; attach an empty database.")
		}
		if err := s.setProgress(ctx, r, progressVerified); err != nil {
			return Org{}, err
		}
	}
	if _, err := store.Migrate(ctx, db, store.OrgSet); err != nil {
		return Org{}, orgDBErr(r.Slug, fmt.Errorf("migrate new org database: %w", err))
	}
	o := r.org()
	o.Status = StatusActive
	if in.OrgEvent != nil {
		if _, err := audit.NewLog(db, audit.OrgTable, nil).Append(ctx, in.OrgEvent(o)); err != nil {
			return Org{}, orgDBErr(r.Slug, fmt.Errorf("org audit log: %w", err))
		}
	}
	var ev *audit.Event
	if in.Event != nil {
		e := in.Event(o)
		ev = &e
	}
	return s.activate(ctx, r, ev)
}

// createDatabase makes the empty database or file of an owned target.
func (s *Service) createDatabase(ctx context.Context, l *orgLock, t target) error {
	if t.dialect == store.Postgres {
		name, err := store.DatabaseName(t.dsn)
		if err != nil {
			return err
		}
		if err := l.exec(ctx, "CREATE DATABASE "+store.QuoteIdent(name)); err != nil {
			return fmt.Errorf("create org database: %w", err)
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(t.dsn), 0o700); err != nil {
		return fmt.Errorf("create orgs dir: %w", err)
	}
	f, err := os.OpenFile(t.dsn, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create org database file: %w", err)
	}
	return f.Close()
}

func (s *Service) setProgress(ctx context.Context, r *orgRow, progress string) error {
	if err := s.cfg.Catalog.WithContext(ctx).Model(&orgRow{}).Where("id = ?", r.ID).
		Update("provision_progress", progress).Error; err != nil {
		return catalogErr(fmt.Errorf("record org progress: %w", err))
	}
	r.Progress = progress
	return nil
}

// activate makes a provisioning org active, with its audit record.
func (s *Service) activate(ctx context.Context, r *orgRow, ev *audit.Event) (Org, error) {
	now := s.cfg.Now().UTC()
	err := s.cfg.Catalog.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&orgRow{}).Where("id = ? AND status = ?", r.ID, StatusProvisioning).
			Updates(map[string]any{"status": StatusActive, "provision_progress": "", "updated_at": now})
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return fmt.Errorf("org %s is no longer provisioning", r.Slug)
		}
		if ev != nil {
			_, err := s.cfg.Audit.AppendTx(ctx, tx, *ev)
			return err
		}
		return nil
	})
	if err != nil {
		return Org{}, catalogErr(fmt.Errorf("activate org: %w", err))
	}
	r.Status, r.Progress, r.UpdatedAt = StatusActive, "", now
	return r.org(), nil
}

// rollback undoes a provisioning org: drops what it owns, then deletes
// its row (with ev, when the reconciler does it).
func (s *Service) rollback(ctx context.Context, l *orgLock, r orgRow, t target, ev *audit.Event) error {
	if r.Progress == progressOwned && !t.attached {
		if err := s.dropData(ctx, l, r.Slug, t); err != nil {
			return err
		}
	}
	return s.deleteRow(ctx, r, ev)
}

func (s *Service) deleteRow(ctx context.Context, r orgRow, ev *audit.Event) error {
	err := s.cfg.Catalog.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Delete(&orgRow{}, r.ID).Error; err != nil {
			return err
		}
		if ev != nil {
			_, err := s.cfg.Audit.AppendTx(ctx, tx, *ev)
			return err
		}
		return nil
	})
	if err != nil {
		return catalogErr(fmt.Errorf("delete org row: %w", err))
	}
	return nil
}

// Delete removes the org's database (or file) and its catalog row. confirm
// must equal the slug: deletion is irreversible.
func (s *Service) Delete(ctx context.Context, slug, confirm string) (Org, error) {
	return s.DeleteAudited(ctx, slug, confirm, nil)
}

// DeleteAudited is Delete whose platform audit record (event, when set)
// commits with the decision to delete: the row turns "deleting" first, so
// a crash during the drop leaves work the reconciler finishes. The org's
// in-flight requests see their tenant context end. The returned Org is the
// org as it was.
func (s *Service) DeleteAudited(ctx context.Context, slug, confirm string, event func(Org) audit.Event) (Org, error) {
	r, err := s.getRow(ctx, slug)
	if err != nil {
		return Org{}, err
	}
	if confirm != slug {
		return Org{}, &apperr.ValidationError{Fields: map[string]string{"confirm": fmt.Sprintf("Type the slug %q to confirm deletion.", slug)}}
	}
	l, err := s.lockOrg(ctx, slug, 0)
	if err != nil {
		return Org{}, err
	}
	defer l.release()
	if r, err = s.getRow(ctx, slug); err != nil {
		return Org{}, err
	}
	if r.Status == StatusProvisioning {
		return Org{}, settled(r)
	}
	before := r.org()
	if r.Status != StatusDeleting { // a retried delete just finishes
		err := s.cfg.Catalog.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Model(&orgRow{}).Where("id = ?", r.ID).
				Updates(map[string]any{"status": StatusDeleting, "updated_at": s.cfg.Now().UTC()}).Error; err != nil {
				return err
			}
			if event != nil {
				_, err := s.cfg.Audit.AppendTx(ctx, tx, event(before))
				return err
			}
			return nil
		})
		if err != nil {
			return Org{}, catalogErr(fmt.Errorf("mark org deleting: %w", err))
		}
	}
	s.revoke(slug, apperr.New(apperr.ErrNotFound, "org_deleted", "Organization %q was deleted.", slug))
	if err := s.finishDelete(context.WithoutCancel(ctx), l, r, nil); err != nil {
		return Org{}, err
	}
	return before, nil
}

// finishDelete drops a deleting org's data and then its row, once the
// org's revoked pools are closed.
func (s *Service) finishDelete(ctx context.Context, l *orgLock, r orgRow, ev *audit.Event) error {
	t, err := s.locate(r)
	if err != nil {
		return err
	}
	if err := s.drained(ctx, r.Slug, drainWait); err != nil {
		return err
	}
	if err := s.dropData(ctx, l, r.Slug, t); err != nil {
		return err
	}
	return s.deleteRow(ctx, r, ev)
}

// drainWait bounds how long a deletion waits for the org's last requests,
// whose contexts the revocation has already ended.
const drainWait = 10 * time.Second

// dropData removes an org's database or file; what is already gone is fine.
func (s *Service) dropData(ctx context.Context, l *orgLock, slug string, t target) error {
	if t.dialect == store.Postgres {
		if !t.attached && l.conn != nil {
			// On the locked session: see orgLock.
			name, err := store.DatabaseName(t.dsn)
			if err != nil {
				return err
			}
			return l.exec(ctx, "DROP DATABASE IF EXISTS "+store.QuoteIdent(name)+" WITH (FORCE)")
		}
		return orgDBErr(slug, dropPostgres(ctx, t.dsn))
	}
	if err := removeSQLite(t.dsn); err != nil {
		return fmt.Errorf("remove org database file: %w", err)
	}
	return nil
}

func tableCountSQL(d store.Dialect) string {
	if d == store.Postgres {
		return "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
	}
	return "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
}

// sqliteFiles are a SQLite database's file and its companions.
func sqliteFiles(path string) []string {
	return []string{path, path + "-wal", path + "-shm", path + "-journal"}
}

func removeSQLite(path string) error {
	var first error
	for _, p := range sqliteFiles(path) {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) && first == nil {
			first = err
		}
	}
	return first
}

func dropPostgres(ctx context.Context, dsn string) error {
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
