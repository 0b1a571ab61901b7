//go:build linux

package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// subreaperSupported: Linux can make agentd a child subreaper.
const subreaperSupported = true

// prSetDumpable is prctl's PR_SET_DUMPABLE.
const prSetDumpable = 4

// hardenProcess makes agentd non-dumpable: /proc/PID/mem, environ and the
// like become root-only and ptrace needs CAP_SYS_PTRACE, so a command of
// another user (or the same non-root user) cannot read the token from
// agentd's memory.
func hardenProcess() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", errno)
	}
	return nil
}

// protectedHardlinks reports whether fs.protected_hardlinks is on: then
// nobody can hard-link a file they could not read and write themselves.
func protectedHardlinks() bool {
	b, err := os.ReadFile("/proc/sys/fs/protected_hardlinks")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}
