package store

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/migrations"
)

// Set names a migration set under migrations/.
type Set string

// The two migration sets.
const (
	CatalogSet Set = "catalog"
	OrgSet     Set = "org"
)

// Migration is one numbered step resolved for a dialect.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations lists the steps of set for dialect in order. A dialect-specific
// file replaces the shared one of the same number.
func Migrations(set Set, d Dialect) ([]Migration, error) {
	entries, err := fs.ReadDir(migrations.FS, string(set))
	if err != nil {
		return nil, fmt.Errorf("read migrations %s: %w", set, err)
	}
	byVersion := map[int]Migration{}
	specific := map[int]bool{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".sql") {
			continue
		}
		base := strings.TrimSuffix(name, ".sql")
		fileDialect := ""
		for _, dd := range []Dialect{SQLite, Postgres} {
			if strings.HasSuffix(base, "."+string(dd)) {
				fileDialect = string(dd)
				base = strings.TrimSuffix(base, "."+string(dd))
			}
		}
		if fileDialect != "" && fileDialect != string(d) {
			continue
		}
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %s/%s: name must start with a number and an underscore", set, name)
		}
		if specific[v] && fileDialect == "" {
			continue
		}
		body, err := fs.ReadFile(migrations.FS, path.Join(string(set), name))
		if err != nil {
			return nil, err
		}
		if prev, dup := byVersion[v]; dup && fileDialect == "" {
			return nil, fmt.Errorf("migration %s: version %d used twice (%s)", set, v, prev.Name)
		}
		byVersion[v] = Migration{Version: v, Name: base, SQL: string(body)}
		if fileDialect != "" {
			specific[v] = true
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// migrationLockKey is the Postgres advisory lock key held while migrating,
// so replicas starting together do not apply a step twice.
const migrationLockKey = 7_470_117_032_001

// Migrate applies every pending step of set, each in its own transaction,
// and returns how many it applied.
func Migrate(ctx context.Context, db *gorm.DB, set Set) (int, error) {
	conn := db.WithContext(ctx)
	if DialectOfDB(db) == Postgres {
		// Session-level lock on a dedicated connection for the whole run.
		sqlDB, err := db.DB()
		if err != nil {
			return 0, err
		}
		c, err := sqlDB.Conn(ctx)
		if err != nil {
			return 0, fmt.Errorf("migration lock connection: %w", err)
		}
		defer c.Close()
		if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock($1)", migrationLockKey); err != nil {
			return 0, fmt.Errorf("migration lock: %w", err)
		}
		defer c.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1)", migrationLockKey) //nolint:errcheck
	}
	if err := conn.Exec(`CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY,
		name TEXT NOT NULL,
		applied_at TIMESTAMP NOT NULL)`).Error; err != nil {
		return 0, fmt.Errorf("create schema_migrations: %w", err)
	}
	pending, err := Pending(ctx, db, set)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, m := range pending {
		applied := false
		err := conn.Transaction(func(tx *gorm.DB) error {
			// Check again under the transaction's write lock: on SQLite
			// another connection (a second open of the same new file) may
			// have applied the step since the list above was read.
			var n int64
			if err := tx.Raw("SELECT count(*) FROM schema_migrations WHERE version = ?", m.Version).Scan(&n).Error; err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			applied = true
			for _, stmt := range splitStatements(m.SQL) {
				if err := tx.Exec(stmt).Error; err != nil {
					return fmt.Errorf("%w\nin statement: %s", err, firstLine(stmt))
				}
			}
			return tx.Exec("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
				m.Version, m.Name, time.Now().UTC()).Error
		})
		if err != nil {
			return n, fmt.Errorf("migration %s/%04d %s: %w", set, m.Version, m.Name, err)
		}
		if applied {
			n++
		}
	}
	return n, nil
}

// Pending lists, in order, the steps of set that db's schema_migrations
// does not hold (the table must exist).
func Pending(ctx context.Context, db *gorm.DB, set Set) ([]Migration, error) {
	steps, err := Migrations(set, DialectOfDB(db))
	if err != nil {
		return nil, err
	}
	var applied []int
	if err := db.WithContext(ctx).Raw("SELECT version FROM schema_migrations").Scan(&applied).Error; err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	done := make(map[int]bool, len(applied))
	for _, v := range applied {
		done[v] = true
	}
	var pending []Migration
	for _, m := range steps {
		if !done[m.Version] {
			pending = append(pending, m)
		}
	}
	return pending, nil
}

// splitStatements splits a migration on semicolons at line ends. Migrations
// keep to one statement per terminated line group; no procedural bodies.
func splitStatements(sql string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") || trimmed == "" {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
