package store_test

import (
	"context"
	"testing"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		for _, set := range []store.Set{store.CatalogSet, store.OrgSet} {
			db := storetest.Open(t, d, set)
			n, err := store.Migrate(context.Background(), db, set)
			if err != nil || n != 0 {
				t.Fatalf("second migrate of %s applied %d, err %v", set, n, err)
			}
			steps, _ := store.Migrations(set, d)
			var count int64
			db.Raw("SELECT count(*) FROM schema_migrations").Scan(&count)
			if int(count) != len(steps) || len(steps) == 0 {
				t.Fatalf("%s: schema_migrations has %d rows, want %d", set, count, len(steps))
			}
		}
	})
}

func TestDialectOf(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]store.Dialect{
		"postgres://u@h/db":   store.Postgres,
		"postgresql://u@h/db": store.Postgres,
		"host=x dbname=y":     store.Postgres,
		"data/catalog.db":     store.SQLite,
	} {
		if got := store.DialectOf(in); got != want {
			t.Errorf("DialectOf(%q) = %s, want %s", in, got, want)
		}
	}
}
