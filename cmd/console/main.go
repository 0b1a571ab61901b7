// Command console runs the Gatehouse admin console and API gateway, and its
// admin commands.
//
//	console [serve] [--listen ADDR] [--data-dir DIR]   run the server (default)
//	console migrate                                    apply catalog and org migrations, then exit
//	console bench gateway [--postgres DSN]             time the terminal gateway against agentd
//	console bench chaos --postgres DSN [--duration 5m]  kill replicas, restart agentd, cut Postgres; check invariants
//	console admin reset-password <email>               give a platform admin a new one-time password
//	console admin create <email>                       add a platform admin with a one-time password
//	console admin list                                 list the platform admins' emails
//	console retention run --org <slug> [--as-of TIME]   apply the org's retention policy once
//
// The console's flags (--data-dir, --listen, ...) go anywhere on the line.
//
// Started under the name agentd (a copy or link named agentd, or
// agentd.exe), the binary is agentd instead (internal/agentd/cli): that is
// the build the console serves at /downloads/agentd/ for its own platform.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd/cli"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/store"
)

func main() {
	if cli.IsAgentdName(os.Args[0]) {
		cli.Main()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "console:", err)
		}
		os.Exit(1)
	}
}

// usage lists the commands; the console's flags (console -h) go anywhere
// on the line, before or after the command.
const usage = `usage: console [command] [flags]

commands:
  serve                                  run the server (the default)
  migrate                                apply catalog and org migrations, then exit
  audit verify --org <slug> | --platform | --file <events.jsonl> [--checkpoint <file>]
  admin list | create <email> | reset-password <email>
  retention run --org <slug> [--as-of <time>]
  bench gateway [bench flags]            time the terminal gateway against agentd

The console's flags (--data-dir, --listen, ...; console -h lists them) may
stand before or after the command; DATABASE_URL and GATEHOUSE_MASTER_KEY
come from the environment.`

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	global, rest, err := config.Split(args)
	if err != nil {
		return fmt.Errorf("%w\n%s", err, usage)
	}
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	cmd, sub := "serve", rest
	if len(rest) > 0 {
		switch {
		case isHelp(rest[0]):
			return help(getenv, stderr)
		case !strings.HasPrefix(rest[0], "-") || rest[0] == "-":
			cmd, sub = rest[0], rest[1:]
		default:
			return fmt.Errorf("flag provided but not defined: %s\n%s", rest[0], usage)
		}
	}
	if cmd == "bench" { // its own flags and throwaway databases
		if len(global) > 0 {
			return fmt.Errorf("console bench runs on throwaway databases of its own and takes none of the console's flags (%s); see console bench gateway -h", global[0])
		}
		return benchCmd(ctx, sub, getenv, stdout, stderr)
	}
	if (cmd == "serve" || cmd == "migrate") && len(sub) > 0 && isHelp(sub[0]) {
		return help(getenv, stderr)
	}
	runCmd, ok := command(cmd)
	if !ok {
		return fmt.Errorf("unknown command %q\n%s", cmd, usage)
	}
	cfg, _, err := config.Load("console "+cmd, global, getenv, stderr)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	return runCmd(ctx, cfg, logger, sub, stdout)
}

// cmdFunc runs a subcommand on the console's configuration, given the
// arguments after its name that are not console flags.
type cmdFunc func(ctx context.Context, cfg config.Config, logger *slog.Logger, args []string, stdout io.Writer) error

// command is the subcommand called name.
func command(name string) (cmdFunc, bool) {
	switch name {
	case "serve":
		return func(ctx context.Context, cfg config.Config, logger *slog.Logger, args []string, stdout io.Writer) error {
			// Anything serve does not understand is refused: a mistyped
			// command must never start a second server on the same data.
			if err := noArgs("serve", args); err != nil {
				return err
			}
			return serve(ctx, cfg, logger, stdout)
		}, true
	case "migrate":
		return func(ctx context.Context, cfg config.Config, logger *slog.Logger, args []string, stdout io.Writer) error {
			if err := noArgs("migrate", args); err != nil {
				return err
			}
			return migrate(ctx, cfg, logger, stdout)
		}, true
	case "audit":
		return auditCmd, true
	case "admin":
		return adminCmd, true
	case "retention":
		return retentionCmd, true
	}
	return nil, false
}

// noArgs refuses arguments a command does not take, suggesting the
// command the line probably meant.
func noArgs(cmd string, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if _, ok := command(args[0]); ok {
		return fmt.Errorf("console %s takes no argument %q (did you mean console %s?)", cmd, args[0], strings.Join(args, " "))
	}
	return fmt.Errorf("console %s takes no argument %q\n%s", cmd, args[0], usage)
}

func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" || a == "help" }

// help prints the commands and the console's flags.
func help(getenv func(string) string, stderr io.Writer) error {
	fmt.Fprintln(stderr, usage)
	fmt.Fprintln(stderr, "\nflags:")
	if err := config.PrintDefaults(getenv, stderr); err != nil {
		return err
	}
	return flag.ErrHelp
}

func serve(ctx context.Context, cfg config.Config, logger *slog.Logger, stdout io.Writer) error {
	// This binary is agentd under that name: it is the build served for
	// the console's own platform.
	if exe, err := os.Executable(); err == nil {
		cfg.AgentdSelf = exe
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	// The listener answers from the start: alive (/healthz) but not ready
	// (/readyz) while the console waits for an unavailable database.
	gate := &console.Gate{}
	srv := &http.Server{Handler: gate, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 3)
	go func() { errc <- srv.Serve(ln) }()
	shutdown := func() error {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		return srv.Shutdown(shutdownCtx)
	}
	c, err := console.NewWhenReachable(ctx, cfg, logger, console.DefaultBackoff)
	if err != nil {
		_ = shutdown()
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer c.Close()
	c.Start()
	gate.Open(c.Handler())
	fmt.Fprintf(stdout, "Gatehouse console listening on %s\nSign in at %s/login\n", ln.Addr(), cfg.BaseURL)
	announceAdmin(cfg, c, logger, stdout)
	if cfg.E2BListen != "" {
		esrv, err := serveEnvd(cfg.E2BListen, c, stdout, errc)
		if err != nil {
			return err
		}
		defer esrv.Close()
	}
	if cfg.MetricsListen != "" {
		msrv, err := serveMetrics(cfg.MetricsListen, c, stdout, errc)
		if err != nil {
			return err
		}
		defer msrv.Close()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	return shutdown()
}

// announceAdmin prints the first admin's one-time password once, and says
// when GATEHOUSE_ADMIN_EMAIL / GATEHOUSE_ADMIN_PASSWORD were ignored, so an
// operator who set them to regain access learns why they have no effect
// and what does.
func announceAdmin(cfg config.Config, c *console.Console, logger *slog.Logger, stdout io.Writer) {
	if c.AdminCreated && c.OneTimePassword != "" {
		fmt.Fprintf(stdout, "\nFirst start: a platform admin was created.\n  email:              %s\n  one-time password:  %s\nIt is shown only now; you will be asked to change it at first sign-in.\n\n", c.AdminEmail, c.OneTimePassword)
	}
	if !c.AdminCreated && (cfg.AdminPassword != "" || cfg.AdminEmail != "") {
		logger.Warn("GATEHOUSE_ADMIN_EMAIL and GATEHOUSE_ADMIN_PASSWORD are ignored: a platform admin already exists, and they only create the first admin on an empty catalog. " +
			"To regain access run: console admin reset-password <email> (console admin list shows the emails).")
	}
}

// migrate applies catalog migrations and then every org's, so an upgrade
// can be run ahead of starting the new version.
func migrate(ctx context.Context, cfg config.Config, logger *slog.Logger, stdout io.Writer) error {
	box, err := console.LoadMasterKey(cfg)
	if err != nil {
		return err
	}
	cat, err := console.OpenCatalog(ctx, cfg)
	if err != nil {
		return err
	}
	defer store.Close(cat)
	fmt.Fprintln(stdout, "catalog: up to date")
	svc := orgs.New(orgs.Config{Catalog: cat, Box: box, DataDir: cfg.DataDir, DBPrefix: cfg.OrgDBPrefix, ServerDSN: cfg.DatabaseURL, Logger: logger})
	defer svc.Close()
	list, err := svc.List(ctx, "", 0)
	if err != nil {
		return err
	}
	for _, o := range list {
		if err := svc.MigrateOrg(ctx, o.Slug); err != nil {
			return fmt.Errorf("org %s: %w", o.Slug, err)
		}
		fmt.Fprintf(stdout, "org %s: up to date\n", o.Slug)
	}
	return nil
}
