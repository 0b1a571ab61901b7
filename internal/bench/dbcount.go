package bench

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/clip"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Profile counts database round trips (statements, BEGINs and commits)
// per kind of gateway request, and what background work (the recording
// followers, sweeps) did meanwhile. It works by wrapping the connection
// pools of the catalog and the org database, and tagging each request's
// context with its kind; statements on an untagged context are background.
type Profile struct {
	mu      sync.Mutex
	tallies map[string]*tally
	on      bool
	// active counts the requests of each kind in the handler now.
	active map[string]int
}

type tally struct {
	requests   int
	statements int
	begins     int
	// commits counts COMMITs and writes outside a transaction;
	// txCommits only the COMMITs (the others are statements already).
	commits   int
	txCommits int
	dbTime    time.Duration
	reqTime   time.Duration
	// poolTrips counts the request's round trips at the pool (store.
	// CountTrips: a pipelined batch is one), which the wrapped
	// connection pool above cannot see.
	poolTrips int
	bySQL     map[string]*sqlCount
}

type sqlCount struct {
	n int
	d time.Duration
}

type ctxKey struct{}

type reqTag struct{ kind string }

func newProfile() *Profile { return &Profile{tallies: map[string]*tally{}, active: map[string]int{}} }

func (p *Profile) inFlight(kind string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.active[kind]
}

func (p *Profile) tallyOf(kind string) *tally {
	t := p.tallies[kind]
	if t == nil {
		t = &tally{bySQL: map[string]*sqlCount{}}
		p.tallies[kind] = t
	}
	return t
}

// Reset forgets what was counted and starts (or stops) counting.
func (p *Profile) Reset(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tallies, p.on = map[string]*tally{}, on
}

func kindOf(ctx context.Context) string {
	if t, ok := ctx.Value(ctxKey{}).(*reqTag); ok {
		return t.kind
	}
	return "background"
}

// statement counts one round trip; a write outside a transaction is its
// own commit.
func (p *Profile) statement(ctx context.Context, query string, d time.Duration, autocommit bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.on {
		return
	}
	t := p.tallyOf(kindOf(ctx))
	t.statements++
	t.dbTime += d
	q := normalizeSQL(query)
	if autocommit && isWrite(q) {
		t.commits++
		q = "(autocommit) " + q
	}
	c := t.bySQL[q]
	if c == nil {
		c = &sqlCount{}
		t.bySQL[q] = c
	}
	c.n++
	c.d += d
}

func (p *Profile) txEvent(kind string, commit bool, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.on {
		return
	}
	t := p.tallyOf(kind)
	t.dbTime += d
	if commit {
		t.commits++
		t.txCommits++
		q := "COMMIT"
		if t.bySQL[q] == nil {
			t.bySQL[q] = &sqlCount{}
		}
		t.bySQL[q].n++
		t.bySQL[q].d += d
	} else {
		t.begins++
	}
}

// enter counts a request of kind in the handler, and reports whether
// its round trips are being counted.
func (p *Profile) enter(kind string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active[kind]++
	return p.on
}

// request counts the end of a request of kind that took d. trips is nil
// when its round trips were not counted (it entered before counting
// began): it is then left out, as a request with no round trips would
// lower the average.
func (p *Profile) request(kind string, d time.Duration, trips *store.Trips) {
	n := 0
	if trips != nil {
		n = trips.N()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active[kind]--
	if !p.on || trips == nil {
		return
	}
	t := p.tallyOf(kind)
	t.requests++
	t.reqTime += d
	t.poolTrips += n
}

func isWrite(q string) bool {
	verb, _, _ := strings.Cut(q, " ")
	switch strings.ToUpper(verb) {
	case "INSERT", "UPDATE", "DELETE":
		return true
	}
	return false
}

func normalizeSQL(q string) string {
	q = strings.Join(strings.Fields(q), " ")
	if len(q) > 90 {
		q = clip.String(q, 90)
	}
	return q
}

// requestKind names a terminal API request for the profile.
func requestKind(r *http.Request) string {
	p := r.URL.Path
	switch {
	case r.Method == http.MethodPost && strings.HasSuffix(p, "/commands"):
		return "exec"
	case strings.HasSuffix(p, "/stdin"):
		return "stdin"
	case strings.HasSuffix(p, "/output"):
		return "output poll"
	default:
		return "other request"
	}
}

// withOpCounter tags each request's context with its kind for p.
func withOpCounter(p *Profile, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := requestKind(r)
		start := time.Now()
		ctx := context.WithValue(r.Context(), ctxKey{}, &reqTag{kind: kind})
		// Round trips are counted only while profiling: counting copies
		// each statement's text, which the timed runs must not pay (the
		// console never counts).
		var trips *store.Trips
		if p.enter(kind) {
			ctx, trips = store.CountTrips(ctx)
		}
		h.ServeHTTP(w, r.WithContext(ctx))
		p.request(kind, time.Since(start), trips)
	})
}

// countingPool wraps a gorm connection pool, reporting every round trip.
type countingPool struct {
	inner gorm.ConnPool
	p     *Profile
}

// instrument makes db's statements count in p. It changes the shared
// handle in place (every session derived from it later counts too), so
// it is for benchmark runs only.
func instrument(db *gorm.DB, p *Profile) error {
	if _, ok := db.Statement.ConnPool.(*countingPool); ok {
		return nil
	}
	_, ok1 := db.Statement.ConnPool.(gorm.TxBeginner)
	_, ok2 := db.Statement.ConnPool.(gorm.ConnPoolBeginner)
	if !ok1 && !ok2 {
		return fmt.Errorf("profile: connection pool %T cannot begin transactions", db.Statement.ConnPool)
	}
	cp := &countingPool{inner: db.Statement.ConnPool, p: p}
	db.Statement.ConnPool = cp
	db.Config.ConnPool = cp
	return nil
}

func (c *countingPool) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return c.inner.PrepareContext(ctx, query)
}

func (c *countingPool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	start := time.Now()
	defer func() { c.p.statement(ctx, query, time.Since(start), true) }()
	return c.inner.ExecContext(ctx, query, args...)
}

func (c *countingPool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	start := time.Now()
	defer func() { c.p.statement(ctx, query, time.Since(start), true) }()
	return c.inner.QueryContext(ctx, query, args...)
}

func (c *countingPool) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	start := time.Now()
	defer func() { c.p.statement(ctx, query, time.Since(start), true) }()
	return c.inner.QueryRowContext(ctx, query, args...)
}

// BeginTx implements gorm.ConnPoolBeginner.
func (c *countingPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	start := time.Now()
	var tx gorm.ConnPool
	var err error
	if b, ok := c.inner.(gorm.TxBeginner); ok {
		tx, err = b.BeginTx(ctx, opts)
	} else {
		tx, err = c.inner.(gorm.ConnPoolBeginner).BeginTx(ctx, opts)
	}
	kind := kindOf(ctx)
	c.p.txEvent(kind, false, time.Since(start))
	if err != nil {
		return nil, err
	}
	return &countingTx{ConnPool: tx, ctx: ctx, kind: kind, p: c.p}, nil
}

// GetDBConn implements gorm.GetDBConnector, so db.DB() still works.
func (c *countingPool) GetDBConn() (*sql.DB, error) {
	if g, ok := c.inner.(gorm.GetDBConnector); ok {
		return g.GetDBConn()
	}
	if d, ok := c.inner.(*sql.DB); ok {
		return d, nil
	}
	return nil, gorm.ErrInvalidDB
}

type countingTx struct {
	gorm.ConnPool
	ctx  context.Context
	kind string
	p    *Profile
}

func (t *countingTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	start := time.Now()
	defer func() { t.p.statement(ctx, query, time.Since(start), false) }()
	return t.ConnPool.ExecContext(ctx, query, args...)
}

func (t *countingTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	start := time.Now()
	defer func() { t.p.statement(ctx, query, time.Since(start), false) }()
	return t.ConnPool.QueryContext(ctx, query, args...)
}

func (t *countingTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	start := time.Now()
	defer func() { t.p.statement(ctx, query, time.Since(start), false) }()
	return t.ConnPool.QueryRowContext(ctx, query, args...)
}

func (t *countingTx) Commit() error {
	start := time.Now()
	defer func() { t.p.txEvent(t.kind, true, time.Since(start)) }()
	return t.ConnPool.(gorm.TxCommitter).Commit()
}

// Rollback implements gorm.TxCommitter.
func (t *countingTx) Rollback() error { return t.ConnPool.(gorm.TxCommitter).Rollback() }

// Print writes the tallies: per request kind, round trips and commits per
// request, database time against request time, and each statement.
func (p *Profile) Print(w io.Writer, perBackground map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kinds := make([]string, 0, len(p.tallies))
	for k := range p.tallies {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		t := p.tallies[k]
		n := t.requests
		label := fmt.Sprintf("%d requests", n)
		if k == "background" {
			n = perBackground[k]
			label = fmt.Sprintf("per %d gateway commands", n)
		}
		if n == 0 {
			continue
		}
		per := func(x int) string { return fmt.Sprintf("%.2f", float64(x)/float64(n)) }
		fmt.Fprintf(w, "  %-13s (%s): round trips/op %s (statements %s, BEGIN %s), commits/op %s, db time/op %s",
			k, label, per(t.statements+t.begins+t.txCommits), per(t.statements), per(t.begins), per(t.commits),
			(t.dbTime / time.Duration(n)).Round(time.Microsecond))
		if t.requests > 0 {
			fmt.Fprintf(w, " of %s in the handler; round trips/op at the pool (a pipelined batch is one) %s",
				(t.reqTime / time.Duration(n)).Round(time.Microsecond), per(t.poolTrips))
		}
		fmt.Fprintln(w)
		qs := make([]string, 0, len(t.bySQL))
		for q := range t.bySQL {
			qs = append(qs, q)
		}
		sort.Slice(qs, func(i, j int) bool {
			return t.bySQL[qs[i]].n > t.bySQL[qs[j]].n || (t.bySQL[qs[i]].n == t.bySQL[qs[j]].n && qs[i] < qs[j])
		})
		for _, q := range qs {
			c := t.bySQL[q]
			fmt.Fprintf(w, "      %5.2f/op %8s avg  %s\n", float64(c.n)/float64(n), (c.d / time.Duration(c.n)).Round(time.Microsecond), q)
		}
	}
}
