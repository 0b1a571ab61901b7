package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os/user"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/platform"
	"github.com/gatehouse/gatehouse/internal/store"
)

const adminUsage = "usage: console admin (reset-password <email> | create <email> | list)"

// adminCmd is the way back in for an operator locked out of the platform
// pages: `console admin reset-password <email>` and `console admin create
// <email>` print a one-time password (changed at first sign-in), and each
// is recorded in the platform audit log. It runs against the same data
// (--data-dir or DATABASE_URL) as the server, which may keep running.
func adminCmd(ctx context.Context, cfg config.Config, logger *slog.Logger, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%s", adminUsage)
	}
	verb, args := args[0], args[1:]
	want := 1
	if verb == "list" {
		want = 0
	}
	if len(args) != want {
		return fmt.Errorf("%s", adminUsage)
	}
	cat, err := console.OpenCatalog(ctx, cfg)
	if err != nil {
		return err
	}
	defer store.Close(cat)
	svc := &platform.Service{DB: cat}
	log := audit.NewLog(cat, audit.PlatformTable, nil)
	actor := audit.Actor{Type: audit.ActorSystem, Name: "console admin " + verb + " (OS user " + osUser() + ")"}

	var (
		a   platform.Admin
		otp string
	)
	switch verb {
	case "list":
		as, err := svc.Admins(ctx)
		if err != nil {
			return err
		}
		if len(as) == 0 {
			fmt.Fprintln(stdout, "No platform admins yet: start the console once, or run console admin create <email>.")
		}
		for _, a := range as {
			fmt.Fprintln(stdout, a.Email)
		}
		return nil
	case "reset-password":
		a, otp, err = svc.ResetPassword(ctx, args[0], log, actor)
	case "create":
		a, otp, err = svc.CreateWithOneTimePassword(ctx, args[0], log, actor)
	default:
		return fmt.Errorf("unknown admin command %q; %s", verb, adminUsage)
	}
	if err != nil {
		return fmt.Errorf("admin %s %s: %w", verb, args[0], err)
	}
	logger.Info("platform admin "+verb, "email", a.Email, "audited_as", actionOf(verb))
	what := "The password of " + a.Email + " was reset; their sign-ins were ended."
	if verb == "create" {
		what = "Platform admin " + a.Email + " was created."
	}
	fmt.Fprintf(stdout, "%s\n  email:              %s\n  one-time password:  %s\nIt is shown only now; it must be changed at first sign-in at %s/login.\n",
		what, a.Email, otp, cfg.BaseURL)
	return nil
}

func actionOf(verb string) string {
	if verb == "create" {
		return platform.ActionAdminCreate
	}
	return platform.ActionAdminPasswordReset
}

// osUser names who ran the command, for the audit record.
func osUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "unknown"
}
