//go:build linux

package agentd

import (
	"fmt"
	"syscall"
)

// SetNonDumpable makes this process non-dumpable (prctl PR_SET_DUMPABLE
// 0): its /proc/PID/mem, environ and fds belong to root and ptrace or
// pidfd_getfd need CAP_SYS_PTRACE, so commands of another user, or of the
// same non-root user, cannot read its secrets or take its descriptors.
// cmd/agentd calls it for agentd; the spawner for itself.
func SetNonDumpable() error {
	const prSetDumpable = 4
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", errno)
	}
	return nil
}
