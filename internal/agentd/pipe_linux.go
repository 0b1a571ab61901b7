//go:build linux

package agentd

import (
	"os"
	"syscall"
)

// busyPipeSize is the kernel buffer given to a pipe once its stream proves
// busy, so large outputs move in fewer, larger reads. Idle pipes keep the
// default size, which keeps the per-user pipe memory limit out of reach.
const busyPipeSize = 1 << 20

const fSetPipeSize = 1031 // F_SETPIPE_SZ

// growPipe enlarges a busy pipe's kernel buffer; failure is harmless.
func growPipe(f *os.File) {
	sc, err := f.SyscallConn()
	if err != nil {
		return
	}
	sc.Control(func(fd uintptr) {
		syscall.Syscall(syscall.SYS_FCNTL, fd, fSetPipeSize, busyPipeSize)
	})
}
