// Command agentd is the terminal daemon every execution environment runs. It
// serves the protocol described in docs/agentd-protocol.md.
//
// The bearer token comes from the AGENTD_TOKEN environment variable or from
// --token-file, never from a flag value (which would show in ps).
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
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

func main() {
	if err := run(os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "agentd: %v\n", err)
		os.Exit(1)
	}
}

// options are the command-line settings.
type options struct {
	listen      string
	tokenFile   string
	addrFile    string
	root        string
	maxSessions int
	ringBytes   int
	sessionTTL  time.Duration
	killGrace   time.Duration
	version     bool
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("agentd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := getenv("AGENTD_LISTEN")
	if listen == "" {
		listen = fmt.Sprintf(":%d", agentd.DefaultPort)
	}
	fs.StringVar(&o.listen, "listen", listen, "address to listen on (env AGENTD_LISTEN)")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token (default: env AGENTD_TOKEN)")
	fs.StringVar(&o.addrFile, "addr-file", "", "write the bound address to this file once listening")
	fs.StringVar(&o.root, "root", getenv("AGENTD_ROOT"), "confine file operations to this directory; default cwd of commands (env AGENTD_ROOT)")
	fs.IntVar(&o.maxSessions, "max-sessions", agentd.DefaultMaxSessions, "maximum concurrently running sessions")
	fs.IntVar(&o.ringBytes, "ring-bytes", agentd.DefaultRingBytes, "output buffer size per session in bytes")
	fs.DurationVar(&o.sessionTTL, "session-ttl", agentd.DefaultSessionTTL, "how long ended sessions stay readable")
	fs.DurationVar(&o.killGrace, "kill-grace", agentd.DefaultKillGrace, "wait between SIGTERM and SIGKILL")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return o, nil
}

func loadToken(o options, getenv func(string) string) (string, error) {
	if o.tokenFile != "" {
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return "", fmt.Errorf("read token file: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", errors.New("the token file is empty")
		}
		return tok, nil
	}
	if tok := getenv("AGENTD_TOKEN"); tok != "" {
		return tok, nil
	}
	return "", errors.New("no token: set AGENTD_TOKEN or pass --token-file")
}

func run(args []string, getenv func(string) string, stderr io.Writer) error {
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if o.version {
		fmt.Fprintln(stderr, agentd.Version)
		return nil
	}
	token, err := loadToken(o, getenv)
	if err != nil {
		return err
	}
	os.Unsetenv("AGENTD_TOKEN") // commands must not inherit it
	logger := slog.New(slog.NewJSONHandler(stderr, nil))

	srv, err := agentd.NewServer(agentd.Config{
		Token:       token,
		Root:        o.root,
		MaxSessions: o.maxSessions,
		RingBytes:   o.ringBytes,
		SessionTTL:  o.sessionTTL,
		KillGrace:   o.killGrace,
		Logger:      logger,
	})
	if err != nil {
		return err
	}
	defer srv.Close()

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	if o.addrFile != "" {
		if err := writeFileAtomic(o.addrFile, []byte(addr+"\n")); err != nil {
			ln.Close()
			return fmt.Errorf("write addr file: %w", err)
		}
	}
	fmt.Fprintf(stderr, "agentd listening on %s\n", addr)

	httpSrv := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	serveErr := make(chan error, 1)
	go func() { serveErr <- httpSrv.Serve(ln) }()

	select {
	case err := <-serveErr:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	// Stop accepting and let requests finish while the process groups are
	// killed; killing them also ends the long-polls.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- httpSrv.Shutdown(shutdownCtx) }()
	srv.Close()
	if err := <-shutdownDone; err != nil {
		httpSrv.Close()
	}
	return nil
}

// writeFileAtomic writes data to a temporary file next to path and renames
// it into place, so readers never see a partial address.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}
