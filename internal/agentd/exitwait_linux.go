//go:build linux

package agentd

import (
	"os"
	"syscall"
)

// exitWatch is a pidfd of a started command, polled through the runtime's
// network poller. Waiting on it parks only a goroutine, whereas
// os.Process.Wait holds an OS thread in waitid for the process's lifetime,
// which would cost a thread per idle session.
type exitWatch struct{ f *os.File }

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
	polled := false
	rc.Read(func(uintptr) bool {
		// The first call only arms the poller; the second comes once the
		// pidfd is readable.
		done := polled
		polled = true
		return done
	})
}

// close releases the pidfd without waiting.
func (w *exitWatch) close() {
	if w != nil {
		w.f.Close()
	}
}
