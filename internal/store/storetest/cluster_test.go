//go:build unix

package storetest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestFindServerBin(t *testing.T) {
	root := t.TempDir()
	mk := func(dir string, bins ...string) string {
		d := filepath.Join(root, dir)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, b := range bins {
			if err := os.WriteFile(filepath.Join(d, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	all := serverBins
	v14 := mk("lib/postgresql/14/bin", all...)
	v17 := mk("lib/postgresql/17/bin", all...)
	mk("lib/postgresql/18/bin", "initdb", "postgres") // no pg_ctl: unusable
	brew := mk("opt/postgresql@16/bin", all...)
	onPath := mk("path", all...)
	clientOnly := mk("client", "initdb") // initdb without a server next to it

	for _, tc := range []struct {
		name, path string
		globs      []string
		want       string
	}{
		{"newest of the globbed versions", "", []string{root + "/lib/postgresql/*/bin", root + "/opt/postgresql@*/bin"}, v17},
		{"homebrew layout", "", []string{root + "/opt/postgresql@*/bin"}, brew},
		{"PATH wins over globs", onPath, []string{root + "/lib/postgresql/*/bin"}, onPath},
		{"PATH without the server falls back", clientOnly, []string{root + "/lib/postgresql/14/bin"}, v14},
		{"nothing found", "", []string{root + "/nowhere/*/bin"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PATH", tc.path)
			got, err := findServerBin(tc.globs)
			if tc.want == "" {
				if err == nil || !strings.Contains(err.Error(), "apt-get install") {
					t.Fatalf("findServerBin = %q, %v; want an error saying what to install", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("findServerBin = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestBinVersion(t *testing.T) {
	for dir, want := range map[string]int{
		"/usr/lib/postgresql/17/bin":                          17,
		"/usr/pgsql-14/bin":                                   14,
		"/opt/homebrew/opt/postgresql@16/bin":                 16,
		"/Applications/Postgres.app/Contents/Versions/15/bin": 15,
		"/opt/homebrew/opt/postgresql/bin":                    0,
	} {
		if got := binVersion(dir); got != want {
			t.Errorf("binVersion(%q) = %d, want %d", dir, got, want)
		}
	}
}

// TestClusterSharedAndReaped starts a real throwaway cluster on a private
// lock file: two holders share it, a live session keeps it up after both
// leave, and once the session ends the reaper stops postgres and removes
// the directory and the lock file.
func TestClusterSharedAndReaped(t *testing.T) {
	lockFile := filepath.Join(t.TempDir(), "pgtest.lock")
	session := exec.Command("sleep", "600")
	if err := session.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = session.Process.Kill(); _ = session.Wait() })

	a, err := acquireCluster(clusterConfig{LockPath: lockFile, Session: session.Process.Pid})
	if err != nil {
		t.Fatal(err)
	}
	b, err := acquireCluster(clusterConfig{LockPath: lockFile})
	if err != nil {
		t.Fatal(err)
	}
	if a.DSN != b.DSN || a.Dir != b.Dir {
		t.Fatalf("second holder got its own cluster: %s in %s vs %s in %s", a.DSN, a.Dir, b.DSN, b.Dir)
	}
	if !serverAnswers(b.DSN) {
		t.Fatal("the cluster does not answer")
	}
	postmaster := postmasterPID(t, a.Dir)
	sock := filepath.Join(a.Dir, ".s.PGSQL."+strings.Split(strings.Split(a.DSN, ":")[2], "/")[0])
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("no Unix socket in the cluster directory: %v", err)
	}

	for _, l := range []*lease{a, b} {
		if err := l.release(); err != nil {
			t.Fatal(err)
		}
	}
	// Give the reaper several looks; the session still runs.
	time.Sleep(5 * reapInterval)
	if !serverAnswers(a.DSN) {
		t.Fatal("the cluster stopped while the session that used it still runs")
	}

	_ = session.Process.Kill()
	_ = session.Wait()
	waitGone(t, a.Dir, lockFile, postmaster)
}

// TestStaleClusterReplaced kills a cluster's reaper: the next user must
// not join the orphan but remove it and start a fresh cluster.
func TestStaleClusterReplaced(t *testing.T) {
	lockFile := filepath.Join(t.TempDir(), "pgtest.lock")
	old, err := acquireCluster(clusterConfig{LockPath: lockFile})
	if err != nil {
		t.Fatal(err)
	}
	defer old.release()
	oldPostmaster := postmasterPID(t, old.Dir)
	b, err := os.ReadFile(lockFile)
	if err != nil {
		t.Fatal(err)
	}
	var st clusterState
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("lock file state %q: %v", b, err)
	}
	if err := syscall.Kill(st.Reaper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Nothing else removes the orphan if the test fails before replacing it.
	t.Cleanup(func() { cleanupStale(st) })
	waitExited(t, st.Reaper)
	// The kernel drops the reaper's flock once every copy of its file
	// descriptor is closed, which may lag the process's exit a little (a
	// child forked around the kill holds a copy until it execs): wait for
	// the cluster to read as dead, as a later test run would find it.
	for deadline := time.Now().Add(10 * time.Second); clusterAlive(st); {
		if time.Now().After(deadline) {
			t.Fatal("the dead reaper's cluster still reads as alive after 10 s")
		}
		time.Sleep(reapInterval)
	}

	fresh, err := acquireCluster(clusterConfig{LockPath: lockFile})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.release()
	if fresh.Dir == old.Dir {
		t.Fatal("joined the cluster of a dead reaper")
	}
	if _, err := os.Stat(old.Dir); !os.IsNotExist(err) {
		t.Fatalf("stale cluster directory left: %v", err)
	}
	waitExited(t, oldPostmaster)
	if !serverAnswers(fresh.DSN) {
		t.Fatal("the fresh cluster does not answer")
	}
	postmaster := postmasterPID(t, fresh.Dir)
	if err := fresh.release(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, fresh.Dir, lockFile, postmaster)
}

// postmasterPID reads the server's pid from the cluster's data directory.
func postmasterPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	return pid
}

// waitGone waits until the reaper has removed the cluster directory and
// lock file and the postmaster has exited.
func waitGone(t *testing.T, dir, lockFile string, postmaster int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, errDir := os.Stat(dir)
		_, errLock := os.Stat(lockFile)
		if os.IsNotExist(errDir) && os.IsNotExist(errLock) && !pidAlive(postmaster) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not reaped: dir %v, lock %v, postmaster alive %v", errDir, errLock, pidAlive(postmaster))
		}
		time.Sleep(reapInterval)
	}
}

// waitExited waits until pid has exited. An orphan's zombie counts as
// exited: whether it is reaped depends on the machine's init.
func waitExited(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for pidAlive(pid) && !zombie(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still running", pid)
		}
		time.Sleep(reapInterval)
	}
}

// zombie reports whether pid has exited but not been reaped (Linux /proc;
// elsewhere false).
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}
