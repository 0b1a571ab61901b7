package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/gatehouse/gatehouse/internal/bench"
	"github.com/gatehouse/gatehouse/internal/chaos"
)

// benchCmd runs `console bench gateway`: the terminal gateway against
// agentd itself, on SQLite and (with --postgres or DATABASE_URL) on
// Postgres, every figure against its target. agentd runs in a child
// process (`console bench agentd`, not for people) so the console's RSS is
// its own.
func benchCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "agentd" {
		root, err := os.MkdirTemp("", "gatehouse-bench-agentd-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(root)
		return bench.ServeAgentdChild(ctx, root, os.Stdin, stdout)
	}
	if len(args) > 0 && args[0] == "chaos" {
		return chaosCmd(ctx, args[1:], getenv, stdout, stderr)
	}
	if len(args) == 0 || args[0] != "gateway" {
		return fmt.Errorf("usage: console bench gateway|chaos [flags] (see console bench gateway -h, console bench chaos -h)")
	}
	fs := flag.NewFlagSet("console bench gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg bench.Config
	fs.IntVar(&cfg.Runs, "runs", 300, "execs and keystrokes timed per path")
	outMiB := fs.Int64("output-mib", 256, "MiB of output per throughput run")
	fs.IntVar(&cfg.Polls, "polls", 2000, "concurrent idle long-polls for the memory figure")
	fs.IntVar(&cfg.Followed, "followed", 2000, "quiet commands followed at once for the followed-commands figures (negative: none)")
	fs.DurationVar(&cfg.IdleWindow, "idle-window", 30*time.Second, "how long the console's CPU is read while the followed commands are quiet")
	fs.IntVar(&cfg.ProfileRuns, "profile-runs", 50, "execs and keystrokes whose database round trips are counted (0: no profile)")
	pg := fs.String("postgres", getenv("DATABASE_URL"), "Postgres server DSN: a throwaway database is created on it and dropped after (default DATABASE_URL; empty: SQLite only)")
	sqlite := fs.Bool("sqlite", true, "also run on SQLite")
	heap := fs.String("heap-profile", "", "write a heap profile of the console while the long-polls wait to this file (the database name is appended)")
	cpu := fs.String("cpu-profile", "", "write CPU profiles of the gateway's timed execs to this file, of its keystrokes to FILE.keystroke, of its output runs to FILE.output-<kind> and of the execs among the followed commands to FILE.followed (the database name is appended)")
	inProcess := fs.Bool("agentd-in-process", false, "serve agentd inside this process instead of a child (its memory then counts in the RSS figure)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	cfg.OutputBytes = *outMiB << 20
	ad, err := benchAgentd(*inProcess)
	if err != nil {
		return err
	}
	defer ad.Close()
	var dsns []string
	if *sqlite {
		dsns = append(dsns, "")
	}
	if *pg != "" {
		dsns = append(dsns, *pg)
	} else {
		fmt.Fprintln(stderr, "bench: Postgres skipped (give --postgres DSN or DATABASE_URL)")
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var results []*bench.Result
	for _, dsn := range dsns {
		r, err := benchOne(ctx, dsn, ad, cfg, profiles{heap: *heap, cpu: *cpu}, logger, stderr)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	bench.Print(stdout, cfg, results)
	return nil
}

func benchAgentd(inProcess bool) (*bench.Agentd, error) {
	if !inProcess {
		if exe, err := os.Executable(); err == nil {
			return bench.SpawnAgentd(exe, "bench", "agentd")
		}
	}
	root, err := os.MkdirTemp("", "gatehouse-bench-agentd-")
	if err != nil {
		return nil, err
	}
	a, err := bench.StartAgentd(root, false)
	if err != nil {
		return nil, err
	}
	stop := a.Close
	a.Close = func() {
		stop()
		_ = os.RemoveAll(root)
	}
	return a, nil
}

// profiles name the profile files to write (empty: none).
type profiles struct{ heap, cpu string }

// benchOne measures one database on a fresh console.
func benchOne(ctx context.Context, dsn string, ad *bench.Agentd, cfg bench.Config, prof profiles, logger *slog.Logger, progress io.Writer) (*bench.Result, error) {
	dir, err := os.MkdirTemp("", "gatehouse-bench-console-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	s, err := bench.Start(ctx, bench.Options{PostgresDSN: dsn, DataDir: dir, Agentd: ad, Logger: logger})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if prof.heap != "" {
		s.HeapProfile = prof.heap + "." + string(s.Dialect)
	}
	if prof.cpu != "" {
		s.CPUProfile = prof.cpu + "." + string(s.Dialect)
	}
	r, err := bench.Run(ctx, s, cfg, progress)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Dialect, err)
	}
	return r, nil
}

// chaosCmd runs `console bench chaos`: several replicas of this very
// binary (`console serve`) on one Postgres, driven through a balancer
// while a chaos loop kills consoles, restarts an agentd and cuts the
// database; it prints the figures and every invariant that broke, and
// fails when one did.
func chaosCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("console bench chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o chaos.Options
	fs.DurationVar(&o.Duration, "duration", 5*time.Minute, "how long the driver runs and the chaos loop injects faults")
	fs.DurationVar(&o.KillEvery, "kill-every", 5*time.Second, "mean time between console SIGKILLs (each is restarted at once)")
	fs.IntVar(&o.Replicas, "replicas", 3, "console processes")
	fs.IntVar(&o.Sessions, "sessions", 20, "sessions kept busy")
	fs.DurationVar(&o.DBCut, "db-cut", 5*time.Second, "how long Postgres is cut, once")
	fs.DurationVar(&o.DBRefuse, "db-refuse", 3*time.Second, "how long the first org's database refuses connections, once")
	fs.StringVar(&o.PostgresDSN, "postgres", getenv("DATABASE_URL"), "Postgres server DSN: throwaway databases are created on it and dropped after (default DATABASE_URL)")
	fs.StringVar(&o.AgentdBin, "agentd", "", "the agentd binary (default: agentd next to this binary, else on PATH)")
	quiet := fs.Bool("quiet", false, "print only the report, not a line per fault")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.PostgresDSN == "" {
		return fmt.Errorf("console bench chaos needs Postgres: give --postgres DSN or DATABASE_URL")
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary to run as the replicas: %w", err)
	}
	o.ConsoleBin = exe
	if o.AgentdBin == "" {
		if o.AgentdBin, err = findAgentd(exe); err != nil {
			return err
		}
	}
	if !*quiet {
		o.Progress = stderr
	}
	rep, err := chaos.Run(ctx, o)
	if err != nil {
		return err
	}
	rep.Print(stdout)
	if !rep.OK() {
		return fmt.Errorf("the chaos run broke %d invariants", len(rep.Violation))
	}
	return nil
}

// findAgentd is agentd next to the console binary, else on PATH.
func findAgentd(exe string) (string, error) {
	sibling := filepath.Join(filepath.Dir(exe), "agentd")
	if fi, err := os.Stat(sibling); err == nil && !fi.IsDir() {
		return sibling, nil
	}
	if p, err := exec.LookPath("agentd"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no agentd binary next to %s or on PATH: build it (go build -o %s ./cmd/agentd) or give --agentd", exe, sibling)
}
