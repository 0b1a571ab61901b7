package directory_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

func TestUsersAndLogins(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		dir := &directory.Directory{DB: storetest.Open(t, d, store.OrgSet)}
		u, otp, err := dir.CreateUser(ctx, " Ada@Example.COM ", "Ada")
		if err != nil {
			t.Fatal(err)
		}
		if u.Email != "ada@example.com" || !u.MustChangePassword || len(otp) < 12 {
			t.Fatalf("created %+v with one-time password %q", u, otp)
		}
		t.Run("bad input is refused with the field named", func(t *testing.T) {
			for _, tc := range []struct{ email, field string }{
				{"not-an-address", "email"},
				{"ada@example.com", "email"}, // taken
			} {
				_, _, err := dir.CreateUser(ctx, tc.email, "x")
				var ve *apperr.ValidationError
				if !errors.As(err, &ve) || ve.Fields[tc.field] == "" {
					t.Errorf("CreateUser(%q) = %v, want a %s error", tc.email, err, tc.field)
				}
			}
		})
		t.Run("sign in with the one-time password, then change it", func(t *testing.T) {
			if _, ok, err := dir.CheckLogin(ctx, "ADA@example.com", otp); err != nil || !ok {
				t.Fatalf("CheckLogin with the one-time password = %v, %v", ok, err)
			}
			if _, ok, err := dir.CheckLogin(ctx, "ada@example.com", "wrong password"); err != nil || ok {
				t.Fatalf("CheckLogin with a wrong password = %v, %v", ok, err)
			}
			if err := dir.ChangePassword(ctx, u.ID, otp, "a much longer passphrase"); err != nil {
				t.Fatal(err)
			}
			got, err := dir.GetUser(ctx, u.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.MustChangePassword {
				t.Error("still must change the password")
			}
		})
		t.Run("disabling ends every login", func(t *testing.T) {
			sub := directory.UserSubject(u.ID)
			id, err := dir.CreateLogin(ctx, sub, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := dir.LoginValid(ctx, id, sub); err != nil || !ok {
				t.Fatalf("fresh login valid = %v, %v", ok, err)
			}
			if ok, err := dir.LoginValid(ctx, id, "user:999"); err != nil || ok {
				t.Errorf("login valid for another subject = %v, %v", ok, err)
			}
			disabled := directory.StatusDisabled
			if _, _, err := dir.UpdateUser(ctx, u.ID, nil, &disabled); err != nil {
				t.Fatal(err)
			}
			if ok, err := dir.LoginValid(ctx, id, sub); err != nil || ok {
				t.Errorf("login valid after disabling the user = %v, %v", ok, err)
			}
		})
		t.Run("a reset gives a new one-time password and ends logins", func(t *testing.T) {
			sub := directory.UserSubject(u.ID)
			id, err := dir.CreateLogin(ctx, sub, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			// The user was disabled above; a sign-in is still recorded and
			// checked as live, so the reset is what must end it.
			if ok, err := dir.LoginValid(ctx, id, sub); err != nil || !ok {
				t.Fatalf("login valid before the reset = %v, %v", ok, err)
			}
			next, err := dir.ResetPassword(ctx, u.ID)
			if err != nil || next == "" || next == otp {
				t.Fatalf("ResetPassword = %q, %v", next, err)
			}
			if ok, err := dir.LoginValid(ctx, id, sub); err != nil || ok {
				t.Errorf("login valid after a reset = %v, %v", ok, err)
			}
		})
		t.Run("missing users are not found", func(t *testing.T) {
			if _, err := dir.GetUser(ctx, 999_999); !errors.Is(err, apperr.ErrNotFound) {
				t.Errorf("GetUser(missing) = %v", err)
			}
		})
	})
}

// TestKeyCreatorRecorded: a key records the id of the user who created
// it, so the approval queue can refuse them as a decider of its requests.
func TestKeyCreatorRecorded(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		dir := &directory.Directory{DB: storetest.Open(t, d, store.OrgSet)}
		u, _, err := dir.CreateUser(ctx, "lee@example.com", "Lee")
		if err != nil {
			t.Fatal(err)
		}
		k, _, err := dir.CreateKey(ctx, directory.NewKey{Name: "svc", CreatedBy: u.Email, CreatedByUserID: &u.ID, Roles: []directory.KeyRole{{Role: "member", Domain: "org"}}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := dir.GetKey(ctx, k.ID)
		if err != nil || !got.IsService() || got.CreatedByUserID == nil || *got.CreatedByUserID != u.ID {
			t.Fatalf("GetKey = %+v, %v", got, err)
		}
	})
}

func TestAPIKeys(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		dir := &directory.Directory{DB: storetest.Open(t, d, store.OrgSet)}
		u, _, err := dir.CreateUser(ctx, "kim@example.com", "Kim")
		if err != nil {
			t.Fatal(err)
		}
		k, secret, err := dir.CreateKey(ctx, directory.NewKey{Name: "laptop", Owner: &u.ID, CreatedBy: u.Email})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(secret, "gh_"+k.Prefix+"_") || k.IsService() || strings.Contains(k.Masked(), secret[len(secret)-6:]) {
			t.Fatalf("key %+v secret %q masked %q", k, secret, k.Masked())
		}
		got, owner, err := dir.VerifyKey(ctx, secret)
		if err != nil || got.ID != k.ID || owner == nil || owner.ID != u.ID {
			t.Fatalf("VerifyKey = %+v, %+v, %v", got, owner, err)
		}
		for name, bad := range map[string]string{
			"wrong secret":   secret[:len(secret)-1] + "x",
			"unknown prefix": "gh_nope_" + strings.Repeat("a", 32),
			"not a key":      "hello",
		} {
			if _, _, err := dir.VerifyKey(ctx, bad); err == nil {
				t.Errorf("%s verified", name)
			}
		}
		if _, err := dir.RevokeKey(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
		if _, _, err := dir.VerifyKey(ctx, secret); err == nil {
			t.Error("a revoked key verified")
		}
		past := time.Now().Add(-time.Minute)
		_, _, err = dir.CreateKey(ctx, directory.NewKey{Name: "old", Owner: &u.ID, CreatedBy: u.Email, ExpiresAt: &past})
		var ve *apperr.ValidationError
		if !errors.As(err, &ve) || ve.Fields["expires_at"] == "" {
			t.Errorf("CreateKey with a past expiry = %v, want an expires_at error", err)
		}

		// A key that expires later stops verifying once the clock passes
		// its expiry, read directly and through the auth cache (whose
		// entry, kept within its TTL, must not outlive the expiry).
		clk := &clock{t: time.Now().Truncate(time.Second)}
		timed := &directory.Directory{DB: dir.DB, Now: clk.now}
		expires := clk.t.Add(time.Hour)
		_, expiring, err := timed.CreateKey(ctx, directory.NewKey{Name: "soon", Owner: &u.ID, CreatedBy: u.Email, ExpiresAt: &expires})
		if err != nil {
			t.Fatal(err)
		}
		cache, err := directory.NewAuthCache(dir.DB)
		if err != nil {
			t.Fatal(err)
		}
		cache.Now = clk.now
		clk.t = expires.Add(-time.Second)
		if _, _, err := timed.VerifyKey(ctx, expiring); err != nil {
			t.Fatalf("VerifyKey a second before expiry = %v", err)
		}
		if _, _, err := cache.VerifyKey(ctx, timed, expiring); err != nil {
			t.Fatalf("cached VerifyKey a second before expiry = %v", err)
		}
		clk.t = expires
		if _, _, err := timed.VerifyKey(ctx, expiring); !errors.Is(err, apperr.ErrUnauthorized) {
			t.Errorf("VerifyKey at expiry = %v, want unauthorized", err)
		}
		if _, _, err := cache.VerifyKey(ctx, timed, expiring); !errors.Is(err, apperr.ErrUnauthorized) {
			t.Errorf("cached VerifyKey at expiry, within the cache TTL = %v, want unauthorized", err)
		}
		clk.t = expires.Add(time.Hour)
		if _, _, err := cache.VerifyKey(ctx, timed, expiring); !errors.Is(err, apperr.ErrUnauthorized) {
			t.Errorf("cached VerifyKey an hour after expiry = %v, want unauthorized", err)
		}
	})
}

func TestDepartments(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		dir := &directory.Directory{DB: storetest.Open(t, d, store.OrgSet)}
		dep, err := dir.CreateDepartment(ctx, "Research", "R&D")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dir.CreateDepartment(ctx, "", ""); err == nil {
			t.Error("a department without a name was created")
		}
		name := "Research Labs"
		before, after, err := dir.UpdateDepartment(ctx, dep.ID, &name, nil)
		if err != nil || before.Name != "Research" || after.Name != name || after.Description != "R&D" {
			t.Fatalf("UpdateDepartment = %+v → %+v, %v", before, after, err)
		}
		list, err := dir.ListDepartments(ctx, []int64{dep.ID})
		if err != nil || len(list) != 1 {
			t.Fatalf("ListDepartments = %+v, %v", list, err)
		}
		if _, err := dir.DeleteDepartment(ctx, dep.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := dir.GetDepartment(ctx, dep.ID); !errors.Is(err, apperr.ErrNotFound) {
			t.Errorf("deleted department = %v", err)
		}
	})
}
