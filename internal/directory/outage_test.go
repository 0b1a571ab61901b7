package directory_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// failUsersReads makes reads of the users table on db fail the way a cut
// connection does while fail is set (the key or login row was read just
// before: the cut fell between the two reads).
func failUsersReads(t *testing.T, db *gorm.DB, fail *atomic.Bool) {
	t.Helper()
	err := db.Callback().Query().Before("gorm:query").Register("test:fail_users", func(tx *gorm.DB) {
		if fail.Load() && tx.Statement.Table == "users" {
			_ = tx.AddError(&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCredentialCheckDuringOutage: when the database fails while a
// credential is checked (after the key or sign-in row was read, before its
// user), the check fails as an outage (503 upstream), not as a bad key or
// an ended sign-in (401, which tells a client to give up). Found by the
// chaos run (internal/bench TestChaos) cutting Postgres under load.
func TestCredentialCheckDuringOutage(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db, _ := replicas(t, d)
		dir := &directory.Directory{DB: db}
		u, _, err := dir.CreateUser(ctx, "outage@example.test", "Outage")
		if err != nil {
			t.Fatal(err)
		}
		_, token, err := dir.CreateKey(ctx, directory.NewKey{Name: "k", Owner: &u.ID})
		if err != nil {
			t.Fatal(err)
		}
		subject := "user:" + strconv.FormatInt(u.ID, 10)
		login, err := dir.CreateLogin(ctx, subject, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		var fail atomic.Bool
		failUsersReads(t, db, &fail)
		fail.Store(true)

		wantOutage := func(t *testing.T, what string, err error) {
			t.Helper()
			if err == nil || errors.Is(err, apperr.ErrUnauthorized) || !store.IsUnavailable(err) {
				t.Errorf("%s with the database failing: %v, want an outage (not a refusal)", what, err)
			}
		}
		t.Run("API key", func(t *testing.T) {
			_, _, err := dir.VerifyKey(ctx, token)
			wantOutage(t, "VerifyKey", err)
		})
		t.Run("sign-in", func(t *testing.T) {
			cache, err := directory.NewAuthCache(db)
			if err != nil {
				t.Fatal(err)
			}
			_, ok, err := cache.LoginUser(ctx, dir, login, subject)
			wantOutage(t, "LoginUser", err)
			if ok {
				t.Error("LoginUser said ok with the user unread")
			}
		})
		t.Run("both work again once the database answers", func(t *testing.T) {
			fail.Store(false)
			if _, owner, err := dir.VerifyKey(ctx, token); err != nil || owner == nil || owner.ID != u.ID {
				t.Errorf("VerifyKey: owner %v, %v", owner, err)
			}
			cache, err := directory.NewAuthCache(db)
			if err != nil {
				t.Fatal(err)
			}
			if user, ok, err := cache.LoginUser(ctx, dir, login, subject); err != nil || !ok || user == nil {
				t.Errorf("LoginUser: %v %v %v", user, ok, err)
			}
		})
	})
}
