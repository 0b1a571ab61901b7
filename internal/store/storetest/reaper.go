//go:build unix

package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// reaperEnv carries the reaper's config (JSON) to the re-executed test
// binary; its presence turns the binary into the reaper.
const reaperEnv = "GATEHOUSE_PGTEST_REAPER"

// reaperLock, in the cluster directory, is flocked by the reaper while it
// lives; joiners test it to tell a live cluster from a stale one.
const reaperLock = "reaper.lock"

// reapInterval is how often the reaper looks for remaining holders.
const reapInterval = 50 * time.Millisecond

// reaperConfig is what the reaper needs to run and later remove a cluster.
type reaperConfig struct {
	LockPath string `json:"lock"`
	Dir      string `json:"dir"`
	Bin      string `json:"bin"`
	Port     int    `json:"port"`
	AsUser   bool   `json:"as_user"`
	UID      int    `json:"uid"`
	GID      int    `json:"gid"`
}

// init turns a test binary started by startReaper into the reaper before
// any test code runs: the reaper must outlive the binary that started the
// cluster, and re-executing that binary needs nothing installed.
func init() {
	v, ok := os.LookupEnv(reaperEnv)
	if !ok {
		return
	}
	var cfg reaperConfig
	if err := json.Unmarshal([]byte(v), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "reaper:", err)
		os.Exit(2)
	}
	if err := runReaper(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "reaper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runReaper runs postgres for cfg.Dir until no holder is left (or it is
// told to stop, or postgres dies), then removes the cluster.
func runReaper(cfg reaperConfig) error {
	alive, err := os.OpenFile(filepath.Join(cfg.Dir, reaperLock), os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("reaper lock: %w", err)
	}
	defer alive.Close()
	if err := flock(alive, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("reaper lock: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(cfg.Dir, "postgres.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("postgres log: %w", err)
	}
	pg := exec.Command(filepath.Join(cfg.Bin, "postgres"),
		"-D", filepath.Join(cfg.Dir, "data"),
		"-p", strconv.Itoa(cfg.Port),
		"-h", "127.0.0.1",
		"-k", cfg.Dir,
		// Throwaway data: durability only costs time.
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200")
	pg.Dir = cfg.Dir
	pg.Stdout, pg.Stderr = logf, logf
	pg.SysProcAttr = &syscall.SysProcAttr{}
	setParentDeathSignal(pg.SysProcAttr, syscall.SIGQUIT)
	if cfg.AsUser {
		pg.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(cfg.UID), Gid: uint32(cfg.GID)}
	}
	if err := pg.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	logf.Close()
	pgDone := make(chan struct{})
	go func() { _ = pg.Wait(); close(pgDone) }()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)

	// While the starter holds the lock it is waiting for the server; if
	// postgres dies now, exit at once so it sees why (it removes the
	// directory). Once the lock is ours, the starter has either published
	// the cluster or given up on it.
	locked := make(chan lockResult, 1)
	go func() { f, err := lockPath(cfg.LockPath); locked <- lockResult{f, err} }()
	select {
	case <-pgDone:
		return errors.New("postgres exited during start")
	case r := <-locked:
		if r.err != nil {
			stopPostgres(pg, pgDone)
			return r.err
		}
		st, _ := readState(r.f)
		if st == nil || st.Dir != cfg.Dir {
			stopPostgres(pg, pgDone)
			os.RemoveAll(cfg.Dir)
			r.f.Close()
			return nil
		}
		r.f.Close()
	}

	tick := time.NewTicker(reapInterval)
	defer tick.Stop()
	for {
		force := false
		select {
		case <-pgDone:
			force = true
		case <-sigs:
			force = true
		case <-tick.C:
		}
		done, err := reapIfIdle(cfg, pg, pgDone, force)
		if done || err != nil {
			return err
		}
	}
}

type lockResult struct {
	f   *os.File
	err error
}

// reapIfIdle stops and removes the cluster when force is set or no holder
// is alive, all under the lock so no one joins meanwhile.
func reapIfIdle(cfg reaperConfig, pg *exec.Cmd, pgDone <-chan struct{}, force bool) (bool, error) {
	lock, err := lockPath(cfg.LockPath)
	if err != nil {
		return false, err
	}
	defer lock.Close()
	if !force && holdersAlive(filepath.Join(cfg.Dir, "holders")) {
		return false, nil
	}
	if st, _ := readState(lock); st == nil || st.Dir == cfg.Dir {
		// Unlinking under the lock is safe: lockPath re-checks the path.
		_ = writeState(lock, nil)
		_ = os.Remove(cfg.LockPath)
	}
	stopPostgres(pg, pgDone)
	if err := os.RemoveAll(cfg.Dir); err != nil {
		return true, fmt.Errorf("remove test cluster: %w", err)
	}
	return true, nil
}

// holdersAlive reports whether any holder file is still flocked by its
// process or names a session (go test) that is still running; dead holder
// files are removed.
func holdersAlive(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	alive := false
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		if err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			alive = true
			continue
		}
		b, _ := os.ReadFile(p)
		f.Close()
		if session, _ := strconv.Atoi(strings.TrimSpace(string(b))); pidAlive(session) {
			alive = true
			continue
		}
		os.Remove(p)
	}
	return alive
}

// stopPostgres shuts the server down immediately (the data is thrown
// away) and waits for it, killing it if it hangs.
func stopPostgres(pg *exec.Cmd, pgDone <-chan struct{}) {
	_ = pg.Process.Signal(syscall.SIGQUIT)
	select {
	case <-pgDone:
	case <-time.After(10 * time.Second):
		_ = pg.Process.Kill()
		<-pgDone
	}
}
