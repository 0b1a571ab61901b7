package orgs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/store"
)

// orgLock is held while one slug is created, deleted, reconciled or its
// orphan removed. Across replicas it is a Postgres advisory lock.
//
// With an org server, the lock lives on a session to that server, and the
// CREATE and DROP DATABASE statements run on the same session. A killed
// console's statement keeps running on the server until it completes, and
// only then does its session end and free the lock: so the reconciler can
// never drop a database before a dead creator's CREATE has finished (which
// would leave a database with no row).
type orgLock struct {
	conn *sql.Conn // the locked session on the org server, or nil
	done func()
}

func (l *orgLock) release() { l.done() }

// exec runs a server statement (CREATE/DROP DATABASE) on the locked session.
func (l *orgLock) exec(ctx context.Context, stmt string) error {
	if l.conn == nil {
		return errors.New("no org database server is configured")
	}
	if _, err := l.conn.ExecContext(ctx, stmt); err != nil {
		return markUnavailable("server", err)
	}
	return nil
}

// has reports whether the server has a database named name.
func (l *orgLock) has(ctx context.Context, name string) (bool, error) {
	if l.conn == nil {
		return false, errors.New("no org database server is configured")
	}
	var n int64
	if err := l.conn.QueryRowContext(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		return false, markUnavailable("server", fmt.Errorf("look up database %s: %w", name, err))
	}
	return n > 0, nil
}

// lockOrg serializes work on one slug and bounds how many such jobs run at
// once. A slug this process is working on answers a conflict at once; one
// locked elsewhere is waited for up to wait (requests pass 0 and answer a
// conflict; the reconciler waits, since a console killed moments ago holds
// its locks until the server notices, and a live one soon finishes).
func (s *Service) lockOrg(ctx context.Context, slug string, wait time.Duration) (*orgLock, error) {
	select {
	case s.work <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	if s.busy[slug] {
		s.mu.Unlock()
		<-s.work
		return nil, orgBusy(slug)
	}
	s.busy[slug] = true
	s.mu.Unlock()
	local := func() {
		s.mu.Lock()
		delete(s.busy, slug)
		s.mu.Unlock()
		<-s.work
	}
	// Keyed by the database name, not the slug: consoles with different
	// prefixes share a server without blocking each other.
	key := store.LockKey("gatehouse-org:" + s.pgName(slug))
	if s.cfg.ServerDSN == "" {
		unlock, ok, err := store.AdvisoryLock(ctx, s.cfg.Catalog, key, wait)
		if err != nil || !ok {
			local()
			if err != nil {
				return nil, catalogErr(fmt.Errorf("lock org %s: %w", slug, err))
			}
			return nil, orgBusy(slug)
		}
		return &orgLock{done: func() { unlock(); local() }}, nil
	}
	server, err := store.Open(ctx, s.cfg.ServerDSN, store.Options{MaxOpenConns: 1})
	if err != nil {
		local()
		return nil, markUnavailable("server", fmt.Errorf("connect to the database server: %w", err))
	}
	fail := func(err error) (*orgLock, error) {
		_ = store.Close(server)
		local()
		return nil, err
	}
	conn, err := sqlConn(ctx, server)
	if err != nil {
		return fail(markUnavailable("server", err))
	}
	got, err := store.LockOnConn(ctx, conn, key, wait)
	if err != nil || !got {
		conn.Close()
		if err != nil {
			return fail(markUnavailable("server", fmt.Errorf("lock org %s: %w", slug, err)))
		}
		return fail(orgBusy(slug))
	}
	return &orgLock{conn: conn, done: func() {
		_, _ = conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1)", key)
		conn.Close()
		_ = store.Close(server)
		local()
	}}, nil
}

func sqlConn(ctx context.Context, db *gorm.DB) (*sql.Conn, error) {
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	return sqlDB.Conn(ctx)
}

// withServer runs fn on a connection to the Postgres server org databases
// are created on.
func (s *Service) withServer(ctx context.Context, fn func(admin *gorm.DB) error) error {
	admin, err := store.Open(ctx, s.cfg.ServerDSN, store.Options{MaxOpenConns: 1})
	if err != nil {
		return markUnavailable("server", fmt.Errorf("connect to the database server: %w", err))
	}
	defer store.Close(admin)
	return fn(admin.WithContext(ctx))
}
