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
	"syscall"
	"time"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "console:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	if cmd == "bench" { // its own flags: no console configuration
		return benchCmd(ctx, args, getenv, stdout, stderr)
	}
	cfg, rest, err := config.Load("console "+cmd, args, getenv, stderr)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	switch cmd {
	case "serve":
		return serve(ctx, cfg, logger, stdout)
	case "migrate":
		return migrate(ctx, cfg, logger, stdout)
	case "audit":
		return auditCmd(ctx, cfg, logger, rest, stdout)
	case "admin":
		return adminCmd(ctx, cfg, logger, rest, stdout)
	default:
		return fmt.Errorf("unknown command %q (want serve, migrate, audit verify or admin)", cmd)
	}
}

func serve(ctx context.Context, cfg config.Config, logger *slog.Logger, stdout io.Writer) error {
	c, err := console.New(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer c.Close()
	c.Start()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	srv := &http.Server{Handler: c.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	fmt.Fprintf(stdout, "Gatehouse console listening on %s\nSign in at %s/login\n", ln.Addr(), cfg.BaseURL)
	announceAdmin(cfg, c, logger, stdout)
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
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
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
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
