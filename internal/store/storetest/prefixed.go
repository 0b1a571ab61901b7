package storetest

import "testing"

// DropPrefixedAtCleanup drops, when the test ends, every database on the
// test server whose name starts with prefix: the org databases a console
// or orgs service under test created with that prefix.
func DropPrefixedAtCleanup(t testing.TB, prefix string) {
	t.Helper()
	t.Cleanup(func() {
		var names []string
		// left() rather than LIKE: the prefix's underscores would be
		// wildcards.
		if err := Admin(t).Raw("SELECT datname FROM pg_database WHERE left(datname, ?) = ?", len(prefix), prefix).Scan(&names).Error; err != nil {
			t.Errorf("list databases with prefix %s: %v", prefix, err)
		}
		for _, n := range names {
			DropPostgresDB(t, n)
		}
	})
}
