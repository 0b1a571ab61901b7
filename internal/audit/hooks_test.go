package audit

import "github.com/gatehouse/gatehouse/internal/store"

// QuerySQL exposes the statement Query runs, for EXPLAIN in benchmarks.
func QuerySQL(l *Log, d store.Dialect, f Filter, limit int) (string, []any) {
	return l.buildSQL(d, f, page{limit: limit})
}

// SetTextWindow shrinks the direct-scan window of free-text queries so
// tests reach the trigram step without seeding ten thousand events.
func SetTextWindow(l *Log, n int64) { l.textWindow = n }
