package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"gorm.io/gorm"
)

// unlockTimeout bounds an advisory lock's release.
const unlockTimeout = 5 * time.Second

// LockKey derives a Postgres advisory lock key from a name.
func LockKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64() >> 1)
}

// TryAdvisoryLock takes a session-level advisory lock on a dedicated
// Postgres connection without waiting and reports whether it got it; the
// lock ends with the returned unlock or with the connection (a crashed
// holder frees it). SQLite is single-node and needs none: it always
// succeeds.
func TryAdvisoryLock(ctx context.Context, db *gorm.DB, key int64) (unlock func(), ok bool, err error) {
	return AdvisoryLock(ctx, db, key, 0)
}

// AdvisoryLock is TryAdvisoryLock waiting up to wait for a holder to let
// go: a holder that just died frees its lock only when the server notices,
// and one still working is better waited for than skipped.
func AdvisoryLock(ctx context.Context, db *gorm.DB, key int64, wait time.Duration) (unlock func(), ok bool, err error) {
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
	got, err := LockOnConn(ctx, conn, key, wait)
	if err != nil || !got {
		conn.Close()
		return nil, false, err
	}
	return func() {
		// Bounded: on a connection the network lost the unlock would
		// wait forever; the lock then ends with the connection.
		uctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
		defer cancel()
		_, _ = conn.ExecContext(uctx, "SELECT pg_advisory_unlock($1)", key)
		conn.Close()
	}, true, nil
}

// LockOnConn takes a session-level advisory lock on conn, waiting up to
// wait (0: not at all). It reports false when the lock stayed taken.
func LockOnConn(ctx context.Context, conn *sql.Conn, key int64, wait time.Duration) (bool, error) {
	if wait <= 0 {
		var got bool
		if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil {
			return false, fmt.Errorf("advisory lock: %w", err)
		}
		return got, nil
	}
	if _, err := conn.ExecContext(ctx, "SELECT set_config('lock_timeout', $1, false)", fmt.Sprintf("%dms", wait.Milliseconds())); err != nil {
		return false, fmt.Errorf("advisory lock timeout: %w", err)
	}
	// The setting is the connection's: put it back, or every later
	// statement on this pooled connection would give up waiting for
	// locks after wait too.
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), "RESET lock_timeout") }()
	_, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key)
	var sqlState interface{ SQLState() string }
	if errors.As(err, &sqlState) && sqlState.SQLState() == "55P03" { // lock_not_available
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("advisory lock: %w", err)
	}
	return true, nil
}
