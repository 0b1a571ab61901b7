package platform_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/platform"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestRecovery: reset and create give one-time passwords that must be
// changed, a reset ends the admin's sign-ins, and each commits with its
// platform audit record; a refused one leaves no record.
func TestRecovery(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		s := newService(t, d)
		log := audit.NewLog(s.DB, audit.PlatformTable, nil)
		cli := audit.Actor{Type: audit.ActorSystem, Name: "console admin (test)"}
		if _, err := s.CreateAdmin(ctx, "root@example.com", "Root", "the old long password", false); err != nil {
			t.Fatal(err)
		}
		before, err := s.Login(ctx, "root@example.com", "the old long password", "192.0.2.1")
		if err != nil {
			t.Fatal(err)
		}
		a, otp, err := s.ResetPassword(ctx, " ROOT@example.com ", log, cli)
		if err != nil || a.Email != "root@example.com" || !a.MustChangePassword || len(otp) < 12 {
			t.Fatalf("ResetPassword = %+v, %q, %v", a, otp, err)
		}
		if _, _, err := s.Authenticate(ctx, before.Token); err == nil {
			t.Error("a sign-in from before the reset still authenticates")
		}
		if _, err := s.Login(ctx, "root@example.com", "the old long password", "192.0.2.1"); !errors.Is(err, apperr.ErrUnauthorized) {
			t.Errorf("the old password after a reset: %v", err)
		}
		if l, err := s.Login(ctx, "root@example.com", otp, "192.0.2.1"); err != nil || !l.Admin.MustChangePassword {
			t.Errorf("sign-in with the one-time password = %+v, %v", l.Admin, err)
		}
		b, otp2, err := s.CreateWithOneTimePassword(ctx, "second@example.com", log, cli)
		if err != nil || !b.MustChangePassword || otp2 == otp {
			t.Fatalf("CreateWithOneTimePassword = %+v, %v", b, err)
		}
		for _, refused := range []func() error{
			func() error { _, _, err := s.ResetPassword(ctx, "nobody@example.com", log, cli); return err },
			func() error {
				_, _, err := s.CreateWithOneTimePassword(ctx, "second@example.com", log, cli)
				return err
			},
		} {
			if err := refused(); err == nil {
				t.Error("a refused recovery command succeeded")
			}
		}
		events, err := log.Query(ctx, audit.Filter{}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{platform.ActionAdminCreate + " second@example.com", platform.ActionAdminPasswordReset + " root@example.com"}
		if len(events) != len(want) {
			t.Fatalf("platform log has %d events, want %d", len(events), len(want))
		}
		for i, e := range events {
			if got := e.Action + " " + e.Target.Name; got != want[i] || e.Actor != cli {
				t.Errorf("event %d = %q by %+v, want %q by %+v", i, got, e.Actor, want[i], cli)
			}
		}
	})
}
