//go:build linux

package agentd

import (
	"os"
	"syscall"
	"time"
	"unsafe"
)

// exitWatch is a pidfd of a started command, polled through the runtime's
// network poller. Waiting on it parks only a goroutine, whereas
// os.Process.Wait holds an OS thread in waitid for the process's lifetime,
// which would cost a thread per idle session.
type exitWatch struct {
	f *os.File
	// foreign marks the pidfd of a command the spawner started: not
	// agentd's child, so waitid cannot look at it, and its exit is read
	// from the pidfd's readiness instead.
	foreign bool
}

// watchExitAttr asks StartProcess for a pidfd; the returned pointer receives
// it.
func watchExitAttr(attr *syscall.SysProcAttr) *int {
	fd := -1
	attr.PidFD = &fd
	return &fd
}

// newExitWatch adopts the pidfd written by StartProcess (nil if none).
func newExitWatch(fd *int) *exitWatch {
	if fd == nil || *fd < 0 {
		return nil
	}
	if err := syscall.SetNonblock(*fd, true); err != nil {
		syscall.Close(*fd)
		return nil
	}
	return &exitWatch{f: os.NewFile(uintptr(*fd), "pidfd")}
}

// wait blocks until the process has exited (a pidfd becomes readable
// then) and releases the pidfd. A nil watch returns at once.
func (w *exitWatch) wait() {
	if w == nil {
		return
	}
	defer w.f.Close()
	rc, err := w.f.SyscallConn()
	if err != nil {
		return
	}
	check := exited
	if w.foreign {
		check = readable
	}
	rc.Read(func(fd uintptr) bool { return check(fd) })
}

// readable reports whether the pidfd polls readable: its process has
// exited (a zombie counts), whoever its parent is. Errors count as
// exited, so a broken pidfd never holds a session open.
func readable(fd uintptr) bool {
	ok, err := pollIn(int(fd), 0)
	return err != nil || ok
}

// pollIn waits at most timeout (0: not at all) for fd to poll readable,
// and reports whether it does.
func pollIn(fd int, timeout time.Duration) (bool, error) {
	pfd := struct {
		fd      int32
		events  int16
		revents int16
	}{fd: int32(fd), events: 0x1} // POLLIN
	ts := syscall.NsecToTimespec(timeout.Nanoseconds())
	n, _, errno := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if errno != 0 {
		return false, errno
	}
	return n > 0, nil
}

// pPIDFD is waitid's idtype for a pidfd (Linux 5.4+).
const pPIDFD = 3

// exited reports whether the pidfd's process has exited, without reaping
// it. The poller's readiness cannot be trusted alone: an exit that happened
// before the first wait is not reported again. Errors (old kernels) count
// as exited so the caller falls back to a blocking Wait.
func exited(fd uintptr) bool {
	var info [128]byte // siginfo_t; si_signo (offset 0) stays 0 until exit
	_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPIDFD, fd, uintptr(unsafe.Pointer(&info[0])),
		syscall.WEXITED|syscall.WNOHANG|syscall.WNOWAIT, 0, 0)
	if errno != 0 {
		return true
	}
	return info[0] != 0 || info[1] != 0 || info[2] != 0 || info[3] != 0
}

// close releases the pidfd without waiting.
func (w *exitWatch) close() {
	if w != nil {
		w.f.Close()
	}
}
