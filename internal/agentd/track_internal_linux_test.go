//go:build linux

package agentd

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
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
