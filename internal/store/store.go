// Package store opens the catalog and org databases (SQLite or Postgres),
// applies the embedded migrations and provides small helpers shared by the
// per-entity store code.
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// Dialect names a database engine.
type Dialect string

// The supported dialects.
const (
	SQLite   Dialect = "sqlite"
	Postgres Dialect = "postgres"
)

// DialectOf tells which engine a DSN is for: postgres:// URLs and
// key=value DSNs are Postgres, anything else is a SQLite file path.
func DialectOf(dsn string) Dialect {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") || strings.Contains(dsn, "host=") {
		return Postgres
	}
	return SQLite
}

// Options tune a pool. Zero values take sane defaults.
type Options struct {
	MaxOpenConns int
	// MaxIdleConns defaults to MaxOpenConns.
	MaxIdleConns int
	ConnMaxIdle  time.Duration
	Logger       *slog.Logger
}

// Open opens a gorm handle for dsn. SQLite files get WAL, foreign keys and a
// busy timeout so concurrent writers queue instead of failing.
func Open(ctx context.Context, dsn string, opt Options) (*gorm.DB, error) {
	cfg := &gorm.Config{
		Logger:                 logger.Discard,
		SkipDefaultTransaction: true,
		TranslateError:         true,
		NowFunc:                func() time.Time { return time.Now().UTC() },
	}
	var dial gorm.Dialector
	switch DialectOf(dsn) {
	case Postgres:
		// Every connection carries the tracer that counts round trips for
		// contexts asking (CountTrips).
		dial = postgres.New(postgres.Config{DSN: dsn, OptionOpenDB: []stdlib.OptionOpenDB{
			stdlib.OptionBeforeConnect(func(_ context.Context, c *pgx.ConnConfig) error {
				c.Tracer = pgTracer{}
				return nil
			})}})
	default:
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dial = sqlite.Open(dsn + sep + "_pragma=foreign_keys(1)&_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	}
	db, err := gorm.Open(dial, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("database handle: %w", err)
	}
	if DialectOf(dsn) == SQLite {
		cp := countingPool{DB: sqlDB, w: newWriters()}
		db.ConnPool, db.Statement.ConnPool = cp, cp
	}
	maxOpen, maxIdle := opt.MaxOpenConns, opt.MaxIdleConns
	if maxOpen == 0 {
		maxOpen = 10
	}
	if maxIdle == 0 {
		// As many idle as open: a pool that closes what a burst opened
		// pays a connect (and, on Postgres, the re-preparing of every
		// statement, which pgx caches per connection) at the next burst.
		// ConnMaxIdle still closes connections unused for minutes.
		maxIdle = maxOpen
	}
	sqlDB.SetMaxOpenConns(maxOpen)
	sqlDB.SetMaxIdleConns(maxIdle)
	if opt.ConnMaxIdle > 0 {
		sqlDB.SetConnMaxIdleTime(opt.ConnMaxIdle)
	} else {
		sqlDB.SetConnMaxIdleTime(5 * time.Minute)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sqlDB.PingContext(pingCtx); err != nil {
		_ = sqlDB.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return db, nil
}

// Close closes the pool behind db.
func Close(db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.Close()
}

// DialectOfDB tells which engine an open handle talks to.
func DialectOfDB(db *gorm.DB) Dialect {
	if db.Dialector.Name() == "postgres" {
		return Postgres
	}
	return SQLite
}

// IsUniqueViolation reports whether err is a unique-constraint failure on
// either engine.
func IsUniqueViolation(err error) bool {
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "UNIQUE constraint failed") || strings.Contains(s, "duplicate key value")
}

// WithDatabase returns a Postgres URL DSN with its database name replaced,
// used to reach the maintenance database and the per-org databases on the
// same server.
func WithDatabase(dsn, name string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("postgres DSN must be a postgres:// URL")
	}
	u.Path = "/" + name
	return u.String(), nil
}

// DatabaseName returns the database a Postgres URL DSN points at.
func DatabaseName(dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("postgres DSN must be a postgres:// URL")
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" {
		return "", fmt.Errorf("postgres DSN names no database")
	}
	return name, nil
}

// QuoteIdent quotes a Postgres identifier.
func QuoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// ByID reads the row of T with primary key id, or answers not found in
// words: what names the kind of row ("user", "api key").
func ByID[T any](ctx context.Context, db *gorm.DB, id int64, what string) (T, error) {
	var v T
	res := db.WithContext(ctx).Where("id = ?", id).Limit(1).Find(&v)
	if res.Error != nil {
		return v, fmt.Errorf("read %s %d: %w", what, id, res.Error)
	}
	if res.RowsAffected == 0 {
		return v, apperr.New(apperr.ErrNotFound, strings.ReplaceAll(what, " ", "_")+"_not_found", "No %s with id %d exists.", what, id)
	}
	return v, nil
}
