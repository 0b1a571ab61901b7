package store

import (
	"context"
	"database/sql"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
)

// Trips counts the round trips to the database made under one context:
// every statement, BEGIN and COMMIT sent, a pipelined batch counting once.
// The speed of the hot paths (an exec, a follower's batch, a lease
// renewal) is their number of round trips, so tests assert that number
// rather than a timing; the console itself never counts (a context
// without a counter costs one context lookup per statement).
type Trips struct {
	mu   sync.Mutex
	sent []string
}

type tripsKey struct{}

// CountTrips returns ctx counting its round trips in the returned Trips.
func CountTrips(ctx context.Context) (context.Context, *Trips) {
	t := &Trips{}
	return context.WithValue(ctx, tripsKey{}, t), t
}

// N is how many round trips were counted.
func (t *Trips) N() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sent)
}

// Sent lists what each round trip sent (a batch's statements joined by
// " | "), for a failing test to show.
func (t *Trips) Sent() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.sent...)
}

// Reset forgets what was counted.
func (t *Trips) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sent = nil
}

func (t *Trips) add(what string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sent = append(t.sent, strings.Join(strings.Fields(what), " "))
}

func tripsOf(ctx context.Context) *Trips {
	if ctx == nil {
		return nil
	}
	t, _ := ctx.Value(tripsKey{}).(*Trips)
	return t
}

// pgTracer counts Postgres round trips: pgx traces each Exec and Query
// (BEGIN and COMMIT through database/sql are Execs) and each batch.
type pgTracer struct{}

func (pgTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if t := tripsOf(ctx); t != nil {
		t.add(d.SQL)
	}
	return ctx
}

func (pgTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (pgTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if t := tripsOf(ctx); t != nil {
		qs := make([]string, 0, d.Batch.Len())
		for _, q := range d.Batch.QueuedQueries {
			qs = append(qs, q.SQL)
		}
		t.add("batch: " + strings.Join(qs, " | "))
	}
	return ctx
}

func (pgTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (pgTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// countingPool counts SQLite's statements, BEGINs and COMMITs for
// contexts that carry a Trips (SQLite runs in-process, so these are calls
// rather than network round trips, but each still costs a trip through
// database/sql and the driver).
//
// It also queues the handle's writers itself (writers): SQLite takes
// one writer at a time, and a writer that finds the file locked sleeps in
// SQLite's busy handler (1, 2, 5, 10 ms and on) before it looks again, so
// an exec meeting a follower's commit waited milliseconds for a lock freed
// in microseconds. Queued here, the next writer starts the moment the
// last one ends. Other processes on the same file (a CLI command) still
// meet the busy handler.
type countingPool struct {
	*sql.DB
	w writers
}

func (c countingPool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if t := tripsOf(ctx); t != nil {
		t.add(query)
	}
	if writes(query) {
		release, err := c.w.acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer release()
	}
	return c.DB.ExecContext(ctx, query, args...)
}

func (c countingPool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if t := tripsOf(ctx); t != nil {
		t.add(query)
	}
	return c.DB.QueryContext(ctx, query, args...)
}

func (c countingPool) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if t := tripsOf(ctx); t != nil {
		t.add(query)
	}
	return c.DB.QueryRowContext(ctx, query, args...)
}

// BeginTx implements gorm.ConnPoolBeginner. Every transaction but a
// read-only one is a writer (the pool begins them IMMEDIATE).
func (c countingPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	t := tripsOf(ctx)
	if t != nil {
		t.add("BEGIN")
	}
	release := func() {}
	if opts == nil || !opts.ReadOnly {
		var err error
		if release, err = c.w.acquire(ctx); err != nil {
			return nil, err
		}
	}
	tx, err := c.DB.BeginTx(ctx, opts)
	if err != nil {
		release()
		return nil, err
	}
	return &countingTx{Tx: tx, t: t, release: release}, nil
}

// GetDBConn implements gorm.GetDBConnector, so db.DB() still works.
func (c countingPool) GetDBConn() (*sql.DB, error) { return c.DB, nil }

type countingTx struct {
	*sql.Tx
	t       *Trips
	release func()
	once    sync.Once
}

// done lets the next writer in, once, however the transaction ended.
func (c *countingTx) done() { c.once.Do(c.release) }

func (c *countingTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if c.t != nil {
		c.t.add(query)
	}
	return c.Tx.ExecContext(ctx, query, args...)
}

func (c *countingTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if c.t != nil {
		c.t.add(query)
	}
	return c.Tx.QueryContext(ctx, query, args...)
}

func (c *countingTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if c.t != nil {
		c.t.add(query)
	}
	return c.Tx.QueryRowContext(ctx, query, args...)
}

// Commit implements gorm.TxCommitter.
func (c *countingTx) Commit() error {
	if c.t != nil {
		c.t.add("COMMIT")
	}
	defer c.done()
	return c.Tx.Commit()
}

// Rollback implements gorm.TxCommitter.
func (c *countingTx) Rollback() error {
	defer c.done()
	return c.Tx.Rollback()
}
