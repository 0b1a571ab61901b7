package store

import (
	"context"
	"fmt"
	"hash/fnv"

	"gorm.io/gorm"
)

// LockKey derives a Postgres advisory lock key from a name.
func LockKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64() >> 1)
}

// TryAdvisoryLock takes a session-level advisory lock on a dedicated
// Postgres connection and reports whether it got it; the lock ends with the
// returned unlock or with the connection (a crashed holder frees it).
// SQLite is single-node and needs none: it always succeeds.
func TryAdvisoryLock(ctx context.Context, db *gorm.DB, key int64) (unlock func(), ok bool, err error) {
	if DialectOfDB(db) != Postgres {
		return func() {}, true, nil
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, false, err
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("advisory lock connection: %w", err)
	}
	var got bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil {
		conn.Close()
		return nil, false, fmt.Errorf("advisory lock: %w", err)
	}
	if !got {
		conn.Close()
		return nil, false, nil
	}
	return func() {
		_, _ = conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1)", key)
		conn.Close()
	}, true, nil
}
