//go:build linux

package agentd

import (
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// TestReadProc proves the scan's /proc/<pid>/stat parser reads a process's
// parent, group, session and start time (the fields after a command name
// that holds spaces and parentheses), and tells a zombie.
func TestReadProc(t *testing.T) {
	self, ok := readProc(os.Getpid())
	r, _, _ := syscall.RawSyscall(syscall.SYS_GETSID, 0, 0, 0)
	sid := int(r)
	if !ok || self.ppid != os.Getppid() || self.pgrp != syscall.Getpgrp() || self.sid != sid || self.start == 0 || self.zombie {
		t.Fatalf("readProc(self) = %+v, %v; want ppid %d pgrp %d sid %d", self, ok, os.Getppid(), syscall.Getpgrp(), sid)
	}
	// A child named "a) b (c" that exits and is not reaped yet.
	dir := t.TempDir()
	if err := os.Symlink("/bin/true", dir+"/a) b (c"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(dir + "/a) b (c")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	var si [128]byte // siginfo_t
	// Wait for the exit without reaping (waitid with WNOWAIT).
	if _, _, errno := syscall.Syscall6(syscall.SYS_WAITID, 1 /* P_PID */, uintptr(pid), uintptr(unsafe.Pointer(&si[0])), syscall.WEXITED|0x1000000 /* WNOWAIT */, 0, 0); errno != 0 {
		t.Fatal(errno)
	}
	child, ok := readProc(pid)
	if !ok || child.ppid != os.Getpid() || !child.zombie || child.start < self.start {
		t.Fatalf("readProc(exited child) = %+v, %v", child, ok)
	}
	_ = cmd.Wait()
	if _, ok := readProc(pid); ok {
		t.Fatal("readProc found a reaped process")
	}
}

// TestFailedStartKillsItsCgroup: a start that failed after something ran
// in its session's cgroup (a spawner given up on mid-start) ends what it
// left there, and the cgroup goes.
func TestFailedStartKillsItsCgroup(t *testing.T) {
	tr, err := newTracker(&Config{Cgroup: CgroupAuto, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.close()
	if tr.parent == "" {
		if cgroupsExpected() {
			t.Fatalf("root with a writable cgroup v2 (as in CI), yet agentd made no cgroup: %v", tr.fallback)
		}
		t.Skipf("no cgroups here (%v, agentd cannot manage cgroups here): the cgroup of a failed start is not tested", tr.fallback)
	}
	attr := &syscall.SysProcAttr{}
	m, started, err := tr.prepare(attr)
	if err != nil {
		t.Fatal(err)
	}
	left := exec.Command("sleep", "60")
	left.SysProcAttr = attr
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- left.Wait() }()
	started(0) // the start is reported failed
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		left.Process.Kill()
		t.Fatal("what the failed start left in its cgroup still runs")
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, err := os.Stat(m.cgroup); err == nil; _, err = os.Stat(m.cgroup) {
		if time.Now().After(deadline) {
			t.Fatalf("the failed start's cgroup %s is still there", m.cgroup)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cgroupsExpected reports a machine where agentd must manage cgroups: it
// runs as root and its own cgroup v2 directory (found as agentd finds it)
// is writable, as in CI; a test of the cgroup mode then fails instead of
// skipping. Elsewhere (a container's read-only cgroup fs, a developer
// without root) it may skip.
func cgroupsExpected() bool {
	own, err := ownCgroup()
	return err == nil && os.Geteuid() == 0 && syscall.Access(own, 2 /* W_OK */) == nil
}
