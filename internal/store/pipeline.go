package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/gorm"
)

// OnPgConn runs fn on one of db's Postgres connections, taken from its
// pool and held for fn, for work that pipelines statements in batches (one
// round trip each), which database/sql cannot. A transaction fn opens it
// must end; a connection left in one (fn failed halfway) is closed rather
// than returned to the pool.
func OnPgConn(ctx context.Context, db *gorm.DB, fn func(c *pgx.Conn) error) error {
	sqlDB, err := db.DB()
	if err != nil {
		return fmt.Errorf("database handle: %w", err)
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return fmt.Errorf("database connection: %w", err)
	}
	defer conn.Close()
	var fnErr error
	err = conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("not a Postgres connection: %T", dc)
		}
		c := sc.Conn()
		fnErr = fn(c)
		if c.PgConn().TxStatus() != 'I' {
			// Whatever fn left open is rolled back by closing.
			return driver.ErrBadConn
		}
		return nil
	})
	if fnErr != nil {
		return fnErr
	}
	if err != nil && !errors.Is(err, driver.ErrBadConn) {
		return err
	}
	return nil
}
