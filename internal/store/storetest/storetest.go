// Package storetest gives each test its own real databases: a SQLite file in
// a temp dir, or a fresh Postgres database dropped when the test ends. Tests
// therefore run in parallel and leave nothing behind.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/store"
)

// DefaultAdminDSN is where tests expect Postgres unless
// GATEHOUSE_TEST_POSTGRES says otherwise.
const DefaultAdminDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// defaultAddr is the address probed for a running server.
const defaultAddr = "127.0.0.1:5432"

// Throwaway, as GATEHOUSE_TEST_POSTGRES, makes the tests use their own
// throwaway cluster even when a server answers at the default address.
const Throwaway = "throwaway"

// StartHint is printed when no Postgres can be used: the tests never skip.
const StartHint = "install the Postgres server binaries (apt-get install -y postgresql) so the tests can start their own, or start a server at 127.0.0.1:5432, or set GATEHOUSE_TEST_POSTGRES to a reachable server's admin DSN"

// server is this test binary's Postgres, chosen once: choosing probes the
// network and may start a cluster, and every test of the binary must use
// the same server. It is package state because its life is the process's.
var server struct {
	once  sync.Once
	dsn   string
	err   error
	lease *lease // kept so the holder file stays open (and flocked)
}

// AdminDSN is the Postgres maintenance DSN tests create databases through:
// GATEHOUSE_TEST_POSTGRES if set, else the server at 127.0.0.1:5432 if one
// answers, else a throwaway cluster shared by the test binaries of this
// `go test` run (see cluster.go). It fails the test if none can be had.
func AdminDSN(t testing.TB) string {
	t.Helper()
	server.once.Do(func() {
		server.dsn, server.lease, server.err = chooseServer()
	})
	if server.err != nil {
		t.Fatalf("no Postgres for the tests: %v\n%s", server.err, StartHint)
	}
	return server.dsn
}

// chooseServer implements AdminDSN's order of preference.
func chooseServer() (string, *lease, error) {
	v := os.Getenv("GATEHOUSE_TEST_POSTGRES")
	if v != "" && v != Throwaway {
		return v, nil, nil
	}
	if v == "" {
		if c, err := net.DialTimeout("tcp", defaultAddr, 2*time.Second); err == nil {
			c.Close()
			return DefaultAdminDSN, nil, nil
		}
	}
	l, err := acquireCluster(defaultClusterConfig())
	if err != nil {
		return "", nil, fmt.Errorf("nothing answers at %s and no throwaway cluster could be started: %w", defaultAddr, err)
	}
	return l.DSN, l, nil
}

// Dialects lists both engines; store tests loop over it.
var Dialects = []store.Dialect{store.SQLite, store.Postgres}

// Each runs fn as a parallel subtest per dialect.
func Each(t *testing.T, fn func(t *testing.T, d store.Dialect)) {
	t.Helper()
	for _, d := range Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			fn(t, d)
		})
	}
}

// NewName returns a unique lowercase name with prefix.
func NewName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// DSN returns a DSN for a brand-new empty database of dialect d, removed at
// test cleanup.
func DSN(t testing.TB, d store.Dialect) string {
	t.Helper()
	if d == store.SQLite {
		return filepath.Join(t.TempDir(), "test.db")
	}
	name := NewName("gh_test_")
	CreatePostgresDB(t, name)
	dsn, err := store.WithDatabase(AdminDSN(t), name)
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// CreatePostgresDB creates database name and drops it at cleanup.
func CreatePostgresDB(t testing.TB, name string) {
	t.Helper()
	admin := Admin(t)
	if err := admin.Exec("CREATE DATABASE " + store.QuoteIdent(name)).Error; err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() { DropPostgresDB(t, name) })
}

// DropPostgresDB drops name if it still exists, disconnecting its users.
func DropPostgresDB(t testing.TB, name string) {
	t.Helper()
	admin := Admin(t)
	if err := admin.Exec("DROP DATABASE IF EXISTS " + store.QuoteIdent(name) + " WITH (FORCE)").Error; err != nil {
		t.Errorf("drop test database %s: %v", name, err)
	}
}

// Admin opens the Postgres maintenance database or fails the test with a
// message saying how to get a Postgres.
func Admin(t testing.TB) *gorm.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	dsn := AdminDSN(t)
	db, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 2})
	if err != nil {
		t.Fatalf("Postgres is not reachable at %s: %v\n%s", dsn, err, StartHint)
	}
	t.Cleanup(func() { _ = store.Close(db) })
	return db
}

// Open opens a fresh migrated database of dialect d for set.
func Open(t testing.TB, d store.Dialect, set store.Set) *gorm.DB {
	t.Helper()
	db, err := store.Open(context.Background(), DSN(t, d), store.Options{})
	if err != nil {
		t.Fatalf("open %s: %v", d, err)
	}
	t.Cleanup(func() { _ = store.Close(db) })
	if _, err := store.Migrate(context.Background(), db, set); err != nil {
		t.Fatalf("migrate %s %s: %v", d, set, err)
	}
	return db
}

// PostgresDatabaseExists reports whether name exists on the test server.
func PostgresDatabaseExists(t testing.TB, name string) bool {
	t.Helper()
	var n int64
	if err := Admin(t).Raw("SELECT count(*) FROM pg_database WHERE datname = ?", name).Scan(&n).Error; err != nil {
		t.Fatal(fmt.Errorf("query pg_database: %w", err))
	}
	return n > 0
}

// RefuseConnections makes database name refuse new connections, as a
// database taken out of service does (SQLSTATE 55000 "database is not
// currently accepting connections" to whoever connects), and ends the
// connections it has (57P01 to their users). The returned func lets
// connections in again; it also runs at cleanup, and twice is harmless.
func RefuseConnections(t testing.TB, name string) (allow func()) {
	t.Helper()
	admin := Admin(t)
	if err := admin.Exec("ALTER DATABASE " + store.QuoteIdent(name) + " ALLOW_CONNECTIONS false").Error; err != nil {
		t.Fatalf("refuse connections to %s: %v", name, err)
	}
	if err := admin.Exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ? AND pid <> pg_backend_pid()", name).Error; err != nil {
		t.Fatalf("end the connections to %s: %v", name, err)
	}
	var once sync.Once
	allow = func() {
		once.Do(func() {
			if err := admin.Exec("ALTER DATABASE " + store.QuoteIdent(name) + " ALLOW_CONNECTIONS true").Error; err != nil {
				t.Errorf("allow connections to %s: %v", name, err)
			}
		})
	}
	t.Cleanup(allow)
	return allow
}
