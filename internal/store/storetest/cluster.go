//go:build unix

package storetest

// A throwaway Postgres cluster for machines where no server is running.
//
// Sharing and reference counting. `go test ./...` runs one test binary per
// package, several at once, each a separate process. They share one cluster
// per user, found through a lock file, os.TempDir()/gatehouse-pgtest-<uid>.lock:
//
//   - Every decision is made holding an exclusive flock on that file, and the
//     file's content is the running cluster's state (JSON), so a process sees
//     either no cluster or a fully started one.
//   - A test binary that needs Postgres either joins the recorded cluster or
//     starts one. Joining means creating a holder file in the cluster's
//     holders/ directory and keeping an flock on it for the rest of the
//     process's life. The kernel drops that flock however the process ends
//     (exit, panic, SIGKILL), so a holder can never leak a reference the way
//     a counter in a file would. The holder file also names the `go` command
//     that ran the binary (test binaries run by `go test` get
//     -test.paniconexit0 and are its children): the cluster stays up until
//     that command exits, so packages that run one after another in the same
//     `go test` reuse the cluster instead of starting one each.
//   - The cluster is owned by a reaper: the test binary that starts the
//     cluster re-executes itself as a detached process (own session, output
//     to a log in the cluster directory) which runs `postgres` as its child
//     (not via `pg_ctl start`, which daemonizes it, so the reaper can wait
//     for it and have it killed with itself).
//     Every 50ms it checks the holders under the lock; when none is alive
//     (no flock held, no recorded `go` command still running) it clears the
//     state, removes the lock file, stops postgres and deletes the cluster
//     directory, all before releasing the lock, so nobody joins a cluster
//     that is going away. Cleanup therefore finishes shortly after the last
//     user (measured: 40-80ms after `go test` exits), not at an arbitrary
//     later time; it cannot be synchronous, as `go test` offers test
//     binaries no hook that runs after its last package. On Linux postgres
//     also gets SIGQUIT if the reaper itself is killed (Pdeathsig); a state
//     left by a killed reaper is found stale by the next run (the reaper's
//     flock on reaper.lock is gone, or the port does not answer), which
//     stops the server with pg_ctl and removes the directory.
//
// Running as root (CI): initdb and postgres refuse to run as root, so both
// run as the unprivileged user "nobody", which exists on every Debian,
// Ubuntu and macOS system; the cluster directory is chowned to it.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gatehouse/gatehouse/internal/store"
)

// runAsUser is who owns and runs the cluster when the tests run as root.
const runAsUser = "nobody"

// binGlobs are where server binaries live when they are not on PATH:
// Debian/Ubuntu, RHEL, Homebrew (Apple silicon and Intel), Postgres.app.
var binGlobs = []string{
	"/usr/lib/postgresql/*/bin",
	"/usr/pgsql-*/bin",
	"/opt/homebrew/opt/postgresql@*/bin",
	"/usr/local/opt/postgresql@*/bin",
	"/opt/homebrew/opt/postgresql/bin",
	"/usr/local/opt/postgresql/bin",
	"/Applications/Postgres.app/Contents/Versions/*/bin",
}

// serverBins are the programs a bin directory must hold.
var serverBins = []string{"initdb", "postgres", "pg_ctl"}

// clusterState is the lock file's content while a cluster runs.
type clusterState struct {
	Dir    string `json:"dir"`
	DSN    string `json:"dsn"`
	Port   int    `json:"port"`
	Bin    string `json:"bin"`
	Reaper int    `json:"reaper"`
}

// clusterConfig says where the shared cluster is coordinated and who keeps
// it alive; tests use their own lock path so they never meet a real run's
// cluster.
type clusterConfig struct {
	LockPath string
	// Session is a pid whose life keeps the cluster up besides the holder's
	// own (the `go test` command), or 0.
	Session int
}

// lease is one process's hold on the shared cluster.
type lease struct {
	DSN    string
	Dir    string
	holder *os.File
}

// release drops the hold; the reaper stops the cluster once no hold (and no
// recorded `go` command) is left.
func (l *lease) release() error {
	return l.holder.Close()
}

// defaultClusterConfig is the per-user coordination point of real runs.
func defaultClusterConfig() clusterConfig {
	return clusterConfig{
		LockPath: filepath.Join(os.TempDir(), fmt.Sprintf("gatehouse-pgtest-%d.lock", os.Getuid())),
		Session:  goTestPID(),
	}
}

// goTestPID is the pid of the `go test` command running this binary, or 0
// when the binary was started some other way. `go test` always passes
// -test.paniconexit0; a binary run by hand has a long-lived shell as its
// parent, which must not keep the cluster up.
func goTestPID() int {
	if f := flag.Lookup("test.paniconexit0"); f != nil && f.Value.String() == "true" {
		return os.Getppid()
	}
	return 0
}

// acquireCluster joins the shared cluster, starting it if none runs.
func acquireCluster(cfg clusterConfig) (*lease, error) {
	lock, err := lockPath(cfg.LockPath)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	st, err := readState(lock)
	if err != nil {
		return nil, err
	}
	if st != nil && !clusterAlive(*st) {
		cleanupStale(*st)
		st = nil
	}
	if st == nil {
		if st, err = startCluster(cfg.LockPath); err != nil {
			return nil, err
		}
		if err := writeState(lock, st); err != nil {
			return nil, err
		}
	}
	holder, err := addHolder(st.Dir, cfg.Session)
	if err != nil {
		return nil, err
	}
	return &lease{DSN: st.DSN, Dir: st.Dir, holder: holder}, nil
}

// lockPath opens path and takes an exclusive flock on it. The reaper
// unlinks the file when it stops the cluster, so after locking we check the
// path still names the locked file and start over if not. O_NOFOLLOW and the
// owner check keep a file planted in a shared /tmp by another user from
// being written to.
func lockPath(path string) (*os.File, error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open test cluster lock: %w", err)
		}
		if err := flock(f, syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		var held, named syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("stat %s: %w", path, err)
		}
		if err := syscall.Stat(path, &named); err == nil && held.Ino == named.Ino && held.Dev == named.Dev {
			if int(held.Uid) != os.Getuid() {
				f.Close()
				return nil, fmt.Errorf("lock file %s belongs to uid %d, not us", path, held.Uid)
			}
			return f, nil
		}
		f.Close()
	}
}

// flock is syscall.Flock retried on EINTR.
func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// readState returns the recorded cluster, or nil when none is recorded.
func readState(lock *os.File) (*clusterState, error) {
	b, err := os.ReadFile(lock.Name())
	if err != nil {
		return nil, fmt.Errorf("read test cluster state: %w", err)
	}
	if len(b) == 0 {
		return nil, nil
	}
	var st clusterState
	if err := json.Unmarshal(b, &st); err != nil || st.Dir == "" {
		// A half-written state from a crashed writer: treat as none.
		return nil, nil
	}
	return &st, nil
}

// writeState records st (nil clears it).
func writeState(lock *os.File, st *clusterState) error {
	var b []byte
	if st != nil {
		var err error
		if b, err = json.Marshal(st); err != nil {
			return fmt.Errorf("encode test cluster state: %w", err)
		}
	}
	if err := lock.Truncate(0); err != nil {
		return fmt.Errorf("clear test cluster state: %w", err)
	}
	if _, err := lock.WriteAt(b, 0); err != nil {
		return fmt.Errorf("write test cluster state: %w", err)
	}
	return nil
}

// clusterAlive reports whether st's reaper still runs (it holds an flock
// on reaper.lock for its whole life, released by the kernel however it
// ends, even before a zombie is reaped) and its server accepts connections.
func clusterAlive(st clusterState) bool {
	f, err := os.Open(filepath.Join(st.Dir, reaperLock))
	if err != nil {
		return false
	}
	defer f.Close()
	if err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		return false
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(st.Port)), 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// cleanupStale stops and removes a cluster whose reaper died. pg_ctl runs
// as the cluster's owner, so it can only signal that user's processes.
func cleanupStale(st clusterState) {
	data := filepath.Join(st.Dir, "data")
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
		cmd := exec.Command(filepath.Join(st.Bin, "pg_ctl"), "stop", "-D", data, "-m", "immediate", "-w", "-t", "10")
		cmd.Dir = st.Dir
		if cred, err := runAsCredential(); err == nil && cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		_ = cmd.Run()
	}
	_ = os.RemoveAll(st.Dir)
}

// pidAlive reports whether a process with pid exists.
func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// addHolder registers this process as a user of the cluster in dir: a file
// it keeps flocked until it exits (or releases), naming the session pid.
func addHolder(dir string, session int) (*os.File, error) {
	f, err := os.CreateTemp(filepath.Join(dir, "holders"), fmt.Sprintf("%d-*", os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("register with test cluster: %w", err)
	}
	if err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock holder file: %w", err)
	}
	if _, err := f.WriteString(strconv.Itoa(session)); err != nil {
		f.Close()
		return nil, fmt.Errorf("write holder file: %w", err)
	}
	return f, nil
}

// findServerBin returns the directory holding initdb, postgres and pg_ctl:
// the one of initdb on PATH, else the newest version under globs.
func findServerBin(globs []string) (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if dir := filepath.Dir(p); hasServerBins(dir) {
			return dir, nil
		}
	}
	var dirs []string
	for _, g := range globs {
		m, _ := filepath.Glob(g)
		for _, d := range m {
			if hasServerBins(d) {
				dirs = append(dirs, d)
			}
		}
	}
	if len(dirs) == 0 {
		return "", errors.New("no Postgres server binaries (initdb, postgres, pg_ctl) on PATH or in " + strings.Join(globs, ", ") +
			"; install them (Debian/Ubuntu: apt-get install -y postgresql; macOS: brew install postgresql@17)")
	}
	sort.SliceStable(dirs, func(i, j int) bool { return binVersion(dirs[i]) > binVersion(dirs[j]) })
	return dirs[0], nil
}

// versionRE finds the major version in a bin directory's path.
var versionRE = regexp.MustCompile(`(?:postgresql[@/-]|pgsql-|Versions/)(\d+)`)

// binVersion is the major version a bin directory's path names, or 0.
func binVersion(dir string) int {
	m := versionRE.FindStringSubmatch(dir)
	if m == nil {
		return 0
	}
	v, _ := strconv.Atoi(m[1])
	return v
}

func hasServerBins(dir string) bool {
	for _, b := range serverBins {
		fi, err := os.Stat(filepath.Join(dir, b))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// runAsCredential is who initdb and postgres run as: nil (ourselves)
// unless we are root, which both refuse.
func runAsCredential() (*syscall.Credential, error) {
	if os.Getuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(runAsUser)
	if err != nil {
		return nil, fmt.Errorf("running as root, the test cluster runs as %q: %w", runAsUser, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("uid of %s: %w", runAsUser, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("gid of %s: %w", runAsUser, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// startCluster creates a cluster directory, runs initdb and starts the
// reaper, which runs postgres; it returns once the server answers. On
// failure the directory is gone or about to be (a reaper that is still
// running sees no state naming it and cleans up).
func startCluster(lockPath string) (*clusterState, error) {
	bin, err := findServerBin(binGlobs)
	if err != nil {
		return nil, err
	}
	cred, err := runAsCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "gatehouse-pgtest-cluster-")
	if err != nil {
		return nil, fmt.Errorf("test cluster directory: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "holders"), 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("test cluster directory: %w", err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("hand the test cluster directory to %s: %w", runAsUser, err)
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"),
		"-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync")
	initdb.Dir = dir
	if cred != nil {
		initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%s: %w\n%s", initdb, err, out)
	}
	// The free port can be taken between closing the probe listener and
	// postgres binding it; try a few.
	for attempt := 1; ; attempt++ {
		st, err := startReaper(lockPath, dir, bin, cred)
		if err == nil {
			return st, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			return nil, err
		}
	}
}

// errPortTaken says postgres could not bind the port it was given.
var errPortTaken = errors.New("port taken")

// startReaper starts the reaper (and through it postgres) for dir on a free
// port and waits until the server answers.
func startReaper(lockPath, dir, bin string, cred *syscall.Credential) (*clusterState, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cfg := reaperConfig{LockPath: lockPath, Dir: dir, Bin: bin, Port: port}
	if cred != nil {
		cfg.UID, cfg.GID, cfg.AsUser = int(cred.Uid), int(cred.Gid), true
	}
	enc, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encode reaper config: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find test binary to run the cluster reaper: %w", err)
	}
	logPath := filepath.Join(dir, "reaper.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("reaper log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), reaperEnv+"="+string(enc))
	cmd.Dir = "/"
	// Never the test's stdout: `go test` waits for every holder of that pipe.
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start cluster reaper: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()

	st := &clusterState{
		Dir:    dir,
		DSN:    fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		Port:   port,
		Bin:    bin,
		Reaper: cmd.Process.Pid,
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			rlog, _ := os.ReadFile(logPath)
			os.RemoveAll(filepath.Join(dir, "postgres.log"))
			err := fmt.Errorf("test cluster postgres exited at start:\n%s%s", log, rlog)
			if strings.Contains(string(log), "could not bind") || strings.Contains(string(log), "already in use") {
				return nil, fmt.Errorf("%w: %w", errPortTaken, err)
			}
			os.RemoveAll(dir)
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
		if serverAnswers(st.DSN) {
			return st, nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			return nil, fmt.Errorf("test cluster did not accept connections within 60s:\n%s", log)
		}
	}
}

// serverAnswers reports whether a Postgres session can be opened at dsn.
func serverAnswers(dsn string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	db, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 1})
	if err != nil {
		return false
	}
	_ = store.Close(db)
	return true
}

// freePort asks the kernel for an unused loopback TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
