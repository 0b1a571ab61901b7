package store_test

import (
	"context"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestCountTrips proves the counter the hot paths' round-trip tests rely
// on: every statement, BEGIN and COMMIT under a counting context is one,
// on both engines, and a context without a counter is not counted.
func TestCountTrips(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		db := storetest.Open(t, d, store.OrgSet)
		if err := db.Exec("CREATE TABLE trips_probe (id INTEGER PRIMARY KEY, v TEXT)").Error; err != nil {
			t.Fatal(err)
		}
		ctx, trips := store.CountTrips(context.Background())
		cases := []struct {
			name string
			op   func(ctx context.Context) error
			want int
		}{
			{"one statement", func(ctx context.Context) error {
				return db.WithContext(ctx).Exec("INSERT INTO trips_probe (id, v) VALUES (1, 'a')").Error
			}, 1},
			{"a read", func(ctx context.Context) error {
				var n int64
				return db.WithContext(ctx).Raw("SELECT count(*) FROM trips_probe").Scan(&n).Error
			}, 1},
			{"a transaction of two statements", func(ctx context.Context) error {
				return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					if err := tx.Exec("INSERT INTO trips_probe (id, v) VALUES (2, 'b')").Error; err != nil {
						return err
					}
					return tx.Exec("UPDATE trips_probe SET v = 'c' WHERE id = 2").Error
				})
			}, 4},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				trips.Reset()
				if err := c.op(ctx); err != nil {
					t.Fatal(err)
				}
				if trips.N() != c.want {
					t.Fatalf("%d round trips, want %d:\n%s", trips.N(), c.want, strings.Join(trips.Sent(), "\n"))
				}
			})
		}
		t.Run("uncounted context", func(t *testing.T) {
			trips.Reset()
			if err := db.Exec("UPDATE trips_probe SET v = 'd'").Error; err != nil {
				t.Fatal(err)
			}
			if trips.N() != 0 {
				t.Fatalf("counted %v", trips.Sent())
			}
		})
	})
}
