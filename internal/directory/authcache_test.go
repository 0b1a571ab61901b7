package directory_test

import (
	"context"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// replicas opens an org database twice: the handle the cache watches and
// a second one standing for another replica, whose writes the cache
// cannot see.
func replicas(t *testing.T, d store.Dialect) (*gorm.DB, *gorm.DB) {
	t.Helper()
	ctx := context.Background()
	dsn := storetest.DSN(t, d)
	open := func() *gorm.DB {
		db, err := store.Open(ctx, dsn, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close(db) })
		return db
	}
	db := open()
	if _, err := store.Migrate(ctx, db, store.OrgSet); err != nil {
		t.Fatal(err)
	}
	return db, open()
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// TestAuthCache proves what a cached credential is trusted for: writes
// through the watched handle (directly or in a transaction) refuse it on
// the next check; another replica's writes within the TTL.
func TestAuthCache(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		cases := []struct {
			name string
			// change revokes the credential; local says whether it
			// went through the watched handle.
			change func(t *testing.T, db, other *gorm.DB, userID, keyID int64, login string)
			local  bool
			// refuses says which credential the change ends: "key",
			// "login" or "both".
			refuses string
		}{
			{"key revoked through the handle", func(t *testing.T, db, _ *gorm.DB, _, keyID int64, _ string) {
				if _, err := (&directory.Directory{DB: db}).RevokeKey(ctx, keyID); err != nil {
					t.Fatal(err)
				}
			}, true, "key"},
			{"user disabled in a transaction on the handle", func(t *testing.T, db, _ *gorm.DB, userID, _ int64, _ string) {
				disabled := directory.StatusDisabled
				err := db.Transaction(func(tx *gorm.DB) error {
					_, _, err := (&directory.Directory{DB: tx}).UpdateUser(ctx, userID, nil, &disabled)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
			}, true, "both"},
			{"signed out through the handle", func(t *testing.T, db, _ *gorm.DB, _, _ int64, login string) {
				if err := (&directory.Directory{DB: db}).RevokeLogin(ctx, login); err != nil {
					t.Fatal(err)
				}
			}, true, "login"},
			{"user disabled by another replica", func(t *testing.T, _, other *gorm.DB, userID, _ int64, _ string) {
				disabled := directory.StatusDisabled
				if _, _, err := (&directory.Directory{DB: other}).UpdateUser(ctx, userID, nil, &disabled); err != nil {
					t.Fatal(err)
				}
			}, false, "both"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				db, other := replicas(t, d)
				dir := &directory.Directory{DB: db}
				u, _, err := dir.CreateUser(ctx, "cache@example.test", "Cache")
				if err != nil {
					t.Fatal(err)
				}
				k, token, err := dir.CreateKey(ctx, directory.NewKey{Name: "k", Owner: &u.ID})
				if err != nil {
					t.Fatal(err)
				}
				subject := directory.UserSubject(u.ID)
				login, err := dir.CreateLogin(ctx, subject, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				cache, err := directory.NewAuthCache(db)
				if err != nil {
					t.Fatal(err)
				}
				clk := &clock{t: time.Now().Add(time.Minute)} // past the creations' quiet period
				cache.Now = clk.now
				valid := func() bool {
					t.Helper()
					_, owner, kerr := cache.VerifyKey(ctx, dir, token)
					user, ok, lerr := cache.LoginUser(ctx, dir, login, subject)
					if lerr != nil {
						t.Fatal(lerr)
					}
					keyOK := kerr == nil && owner != nil && owner.Status == directory.StatusActive
					loginOK := ok && user != nil && user.Status == directory.StatusActive
					switch tc.refuses {
					case "key":
						return keyOK
					case "login":
						return loginOK
					}
					if keyOK != loginOK {
						t.Fatalf("key %v and sign-in %v disagree", keyOK, loginOK)
					}
					return keyOK
				}
				if !valid() {
					t.Fatal("fresh credentials refused")
				}
				tc.change(t, db, other, u.ID, k.ID, login)
				if tc.local {
					if valid() {
						t.Fatal("still accepted after the change through the watched handle")
					}
					return
				}
				if !valid() {
					t.Fatal("another replica's change was seen at once: the entry was not cached")
				}
				clk.t = clk.t.Add(directory.DefaultAuthTTL)
				if valid() {
					t.Fatalf("still accepted %s after another replica's change", directory.DefaultAuthTTL)
				}
			})
		}
	})
}

// TestAuthCacheQuietAfterWrite: right after a write to the credential
// tables nothing is cached, so rows read while that write was not yet
// committed are not kept.
func TestAuthCacheQuietAfterWrite(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db, other := replicas(t, d)
		dir := &directory.Directory{DB: db}
		u, _, err := dir.CreateUser(ctx, "quiet@example.test", "Quiet")
		if err != nil {
			t.Fatal(err)
		}
		_, token, err := dir.CreateKey(ctx, directory.NewKey{Name: "k", Owner: &u.ID})
		if err != nil {
			t.Fatal(err)
		}
		cache, err := directory.NewAuthCache(db)
		if err != nil {
			t.Fatal(err)
		}
		clk := &clock{t: time.Now()}
		cache.Now = clk.now
		cache.Clear() // a write just happened
		if _, _, err := cache.VerifyKey(ctx, dir, token); err != nil {
			t.Fatal(err)
		}
		disabled := directory.StatusDisabled
		if _, _, err := (&directory.Directory{DB: other}).UpdateUser(ctx, u.ID, nil, &disabled); err != nil {
			t.Fatal(err)
		}
		if _, owner, err := cache.VerifyKey(ctx, dir, token); err == nil && owner.Status == directory.StatusActive {
			t.Fatal("a key read within the quiet period after a write was cached")
		}
	})
}

// TestAuthCacheKeepsEntriesOnInsert: a sign-in, a new key or a new user
// cannot make a cached success wrong (failures are never cached), so they
// leave the cache alone: an entry cached before them is still served,
// which shows as another replica's change not yet seen.
func TestAuthCacheKeepsEntriesOnInsert(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db, other := replicas(t, d)
		dir := &directory.Directory{DB: db}
		u, _, err := dir.CreateUser(ctx, "insert@example.test", "Insert")
		if err != nil {
			t.Fatal(err)
		}
		_, token, err := dir.CreateKey(ctx, directory.NewKey{Name: "k", Owner: &u.ID})
		if err != nil {
			t.Fatal(err)
		}
		cache, err := directory.NewAuthCache(db)
		if err != nil {
			t.Fatal(err)
		}
		clk := &clock{t: time.Now().Add(time.Minute)} // past the creations' quiet period
		cache.Now = clk.now
		if _, _, err := cache.VerifyKey(ctx, dir, token); err != nil {
			t.Fatal(err)
		}
		// Inserts through the watched handle: a sign-in, a key, a user.
		login, err := dir.CreateLogin(ctx, directory.UserSubject(u.ID), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := dir.CreateKey(ctx, directory.NewKey{Name: "k2", Owner: &u.ID}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := dir.CreateUser(ctx, "another@example.test", "Another"); err != nil {
			t.Fatal(err)
		}
		disabled := directory.StatusDisabled
		if _, _, err := (&directory.Directory{DB: other}).UpdateUser(ctx, u.ID, nil, &disabled); err != nil {
			t.Fatal(err)
		}
		if _, owner, err := cache.VerifyKey(ctx, dir, token); err != nil || owner == nil || owner.Status != directory.StatusActive {
			t.Fatalf("after inserts the key was read again (owner %+v, %v): they cleared the cache", owner, err)
		}
		// The new sign-in, never cached, is read fresh: disabling its user
		// (on the other replica) ended it.
		if user, ok, err := cache.LoginUser(ctx, dir, login, directory.UserSubject(u.ID)); err != nil || ok {
			t.Fatalf("new sign-in = %+v, %v, %v; want it read fresh and refused", user, ok, err)
		}
	})
}
