package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/platform"
)

var otpLine = regexp.MustCompile(`one-time password:\s+(\S+)`)

// runAdmin runs `console admin --data-dir dir args...` as main would and
// returns what it printed.
func runAdmin(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(t.Context(), append([]string{"admin", "--data-dir", dir}, args...), func(string) string { return "" }, &out, io.Discard)
	return out.String(), err
}

// openConsole assembles the console on dir as `console serve` does, with
// the given admin environment, and returns what it logged at start. The
// caller closes it.
func openConsole(t *testing.T, dir, email, password string) (*console.Console, string, string) {
	t.Helper()
	cfg := config.Config{DataDir: dir, AdminEmail: email, AdminPassword: password, TokenTTL: time.Hour, BaseURL: "http://console.test"}
	var logs, out bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	c, err := console.New(context.Background(), cfg, logger)
	if err != nil {
		t.Fatalf("console.New: %v", err)
	}
	c.Platform.Sleep = func(context.Context, time.Duration) {}
	announceAdmin(cfg, c, logger, &out)
	return c, logs.String(), out.String()
}

// TestAdminRecovery is a locked-out platform admin's way back: reset and
// create print a one-time password that signs in (and must be changed),
// the old password and sign-ins stop working, and each step is in the
// platform audit log with who ran it.
func TestAdminRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	c, _, first := openConsole(t, dir, "root@example.com", "")
	t.Cleanup(c.Close)
	otp0 := otpLine.FindStringSubmatch(first)
	if otp0 == nil {
		t.Fatalf("first start printed no one-time password:\n%s", first)
	}
	before, err := c.Platform.Login(ctx, "root@example.com", otp0[1], "192.0.2.1")
	if err != nil {
		t.Fatalf("sign in with the first one-time password: %v", err)
	}

	out, err := runAdmin(t, dir, "reset-password", "Root@Example.com")
	if err != nil {
		t.Fatalf("admin reset-password: %v\n%s", err, out)
	}
	m := otpLine.FindStringSubmatch(out)
	if m == nil || m[1] == otp0[1] || !strings.Contains(out, "root@example.com") {
		t.Fatalf("reset-password printed no new one-time password:\n%s", out)
	}
	if _, err := c.Platform.Login(ctx, "root@example.com", otp0[1], "192.0.2.1"); !errors.Is(err, apperr.ErrUnauthorized) {
		t.Errorf("the old password still signs in: %v", err)
	}
	if _, _, err := c.Platform.Authenticate(ctx, before.Token); err == nil {
		t.Error("a sign-in from before the reset still authenticates")
	}
	l, err := c.Platform.Login(ctx, "root@example.com", m[1], "192.0.2.1")
	if err != nil || !l.Admin.MustChangePassword {
		t.Fatalf("sign in with the reset one-time password = %+v, %v; want a sign-in that must change its password", l.Admin, err)
	}

	out, err = runAdmin(t, dir, "create", "second@example.com")
	if err != nil || otpLine.FindStringSubmatch(out) == nil {
		t.Fatalf("admin create = %v:\n%s", err, out)
	}
	if l, err := c.Platform.Login(ctx, "second@example.com", otpLine.FindStringSubmatch(out)[1], "192.0.2.1"); err != nil || !l.Admin.MustChangePassword {
		t.Fatalf("sign in as the created admin = %+v, %v", l.Admin, err)
	}
	if out, err = runAdmin(t, dir, "list"); err != nil || out != "root@example.com\nsecond@example.com\n" {
		t.Errorf("admin list = %q, %v", out, err)
	}

	refusals := []struct {
		name string
		args []string
		want string
	}{
		{"unknown email", []string{"reset-password", "nobody@example.com"}, "no platform admin"},
		{"existing email", []string{"create", "second@example.com"}, "already exists"},
		{"invalid email", []string{"create", "not-an-email"}, "email"},
		{"missing email", []string{"reset-password"}, "usage"},
		{"unknown verb", []string{"delete", "root@example.com"}, "unknown admin command"},
	}
	for _, r := range refusals {
		if out, err := runAdmin(t, dir, r.args...); err == nil || !strings.Contains(err.Error(), r.want) || strings.Contains(out, "one-time password") {
			t.Errorf("%s: admin %v = %v, printed %q; want an error mentioning %q and no password", r.name, r.args, err, out, r.want)
		}
	}

	events, err := c.Audit.Query(ctx, audit.Filter{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range slices.Backward(events) {
		if e.Action == platform.ActionAdminCreate || e.Action == platform.ActionAdminPasswordReset {
			got = append(got, e.Action+" "+e.Target.Name+" by "+e.Actor.Name)
			if e.Actor.Type != audit.ActorSystem {
				t.Errorf("%s recorded with actor type %q", e.Action, e.Actor.Type)
			}
		}
	}
	want := regexp.MustCompile(`^platform\.admin_create root@example.com by bootstrap;platform\.admin_password_reset root@example.com by console admin reset-password \(OS user .+\);platform\.admin_create second@example.com by console admin create \(OS user .+\)$`)
	if !want.MatchString(strings.Join(got, ";")) {
		t.Errorf("platform audit log has %q", got)
	}
	if res, err := c.Audit.Verify(ctx); err != nil || !res.OK {
		t.Errorf("platform audit chain after the commands: %+v, %v", res, err)
	}
}

// TestAdminEnvIgnoredIsLogged: once an admin exists, a start with
// GATEHOUSE_ADMIN_PASSWORD set says that it was ignored, why, and what
// to run instead; a start without it says nothing of the kind.
func TestAdminEnvIgnoredIsLogged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c, logs, out := openConsole(t, dir, "root@example.com", "correct horse battery staple")
	c.Close()
	if strings.Contains(logs, "ignored") || strings.Contains(out, "one-time password") {
		t.Errorf("the first start with a chosen password logged %q and printed %q", logs, out)
	}
	cases := []struct {
		name, email, password string
		ignored               bool
	}{
		{"password set again", "root@example.com", "a different password!", true},
		{"email only", "other@example.com", "", true},
		{"neither", "", "", false},
	}
	for _, tc := range cases {
		c, logs, _ := openConsole(t, dir, tc.email, tc.password)
		c.Close()
		said := strings.Contains(logs, "GATEHOUSE_ADMIN_PASSWORD are ignored: a platform admin already exists") &&
			strings.Contains(logs, "console admin reset-password <email>")
		if said != tc.ignored {
			t.Errorf("%s: start logged %q; want the ignored notice: %v", tc.name, logs, tc.ignored)
		}
	}
}
