package audit

import "github.com/gatehouse/gatehouse/internal/store"

// QuerySQL exposes the statement Query runs, for EXPLAIN in benchmarks.
func QuerySQL(l *Log, d store.Dialect, f Filter, limit int) (string, []any) {
	return l.buildSQL(d, f, page{limit: limit})
}
