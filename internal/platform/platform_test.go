package platform_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/platform"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

func newService(t *testing.T, d store.Dialect) *platform.Service {
	t.Helper()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	return &platform.Service{DB: storetest.Open(t, d, store.CatalogSet), Signer: auth.NewSigner("k1", key, "platform", time.Hour, nil),
		Throttle: auth.NewThrottle(nil), Sleep: func(context.Context, time.Duration) {}}
}

func TestBootstrapSignInAndOut(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		s := newService(t, d)
		created, otp, err := s.Bootstrap(ctx, "Root@Example.com", "")
		if err != nil || !created || len(otp) < 12 {
			t.Fatalf("Bootstrap = %v, %q, %v", created, otp, err)
		}
		if again, _, err := s.Bootstrap(ctx, "other@example.com", "x"); err != nil || again {
			t.Fatalf("a second bootstrap created an admin: %v, %v", again, err)
		}
		l, err := s.Login(ctx, "root@example.com", otp, "192.0.2.1")
		if err != nil || !l.Admin.MustChangePassword || l.Token == "" {
			t.Fatalf("Login = %+v, %v", l, err)
		}
		a, claims, err := s.Authenticate(ctx, l.Token)
		if err != nil || a.Email != "root@example.com" {
			t.Fatalf("Authenticate = %+v, %v", a, err)
		}
		if ok, err := s.LoginActive(ctx, claims.LoginID, fmt.Sprint(a.ID)); err != nil || !ok {
			t.Fatalf("LoginActive = %v, %v", ok, err)
		}
		t.Run("wrong passwords say nothing about which part was wrong", func(t *testing.T) {
			for _, email := range []string{"root@example.com", "nobody@example.com"} {
				if _, err := s.Login(ctx, email, "wrong password!", "192.0.2.2"); !errors.Is(err, apperr.ErrUnauthorized) {
					t.Errorf("Login(%s, wrong) = %v", email, err)
				}
			}
		})
		t.Run("changing the one-time password", func(t *testing.T) {
			if err := s.ChangePassword(ctx, fmt.Sprint(a.ID), "not it", "a long new passphrase"); err == nil {
				t.Error("changed with a wrong current password")
			}
			if err := s.ChangePassword(ctx, fmt.Sprint(a.ID), otp, "a long new passphrase"); err != nil {
				t.Fatal(err)
			}
			l2, err := s.Login(ctx, "root@example.com", "a long new passphrase", "192.0.2.3")
			if err != nil || l2.Admin.MustChangePassword {
				t.Fatalf("after the change: %+v, %v", l2, err)
			}
		})
		t.Run("logout ends that login only", func(t *testing.T) {
			other, err := s.Login(ctx, "root@example.com", "a long new passphrase", "192.0.2.4")
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Logout(ctx, claims.LoginID); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.Authenticate(ctx, l.Token); !errors.Is(err, auth.ErrInvalidToken) {
				t.Errorf("token after logout = %v", err)
			}
			if _, _, err := s.Authenticate(ctx, other.Token); err != nil {
				t.Errorf("another login ended too: %v", err)
			}
		})
	})
}

func TestCreateAdminValidation(t *testing.T) {
	t.Parallel()
	s := newService(t, store.SQLite)
	ctx := context.Background()
	cases := []struct {
		name, email, password, field string
	}{
		{"bad email", "no-at-sign", "a long passphrase", "email"},
		{"short password", "a@example.com", "short", "password"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.CreateAdmin(ctx, tc.email, "x", tc.password, false)
			var ve *apperr.ValidationError
			if !errors.As(err, &ve) || ve.Fields[tc.field] == "" {
				t.Fatalf("CreateAdmin = %v, want a %s error", err, tc.field)
			}
		})
	}
	if _, err := s.CreateAdmin(ctx, "dup@example.com", "x", "a long passphrase", false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateAdmin(ctx, "DUP@example.com", "x", "a long passphrase", false); err == nil {
		t.Error("a second admin with the same email (other case) was created")
	}
}
