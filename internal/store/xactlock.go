package store

import (
	"fmt"

	"gorm.io/gorm"
)

// XactLock takes the Postgres advisory lock named name (see LockKey) until
// tx ends, waiting for a holder to commit or roll back: a check that must
// see every earlier writer's rows (a count against a cap) runs under it.
// SQLite needs none: its transactions hold the write lock from BEGIN.
func XactLock(tx *gorm.DB, name string) error {
	if DialectOfDB(tx) != Postgres {
		return nil
	}
	if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", LockKey(name)).Error; err != nil {
		return fmt.Errorf("lock %s: %w", name, err)
	}
	return nil
}
