//go:build linux

package cli

import (
	"os"
	"strings"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// subreaperSupported: Linux can make agentd a child subreaper.
const subreaperSupported = true

// hardenProcess makes agentd non-dumpable (agentd.SetNonDumpable), so a
// command of another user (or the same non-root user) cannot read the
// token from agentd's memory.
func hardenProcess() error { return agentd.SetNonDumpable() }

// protectedHardlinks reports whether fs.protected_hardlinks is on: then
// nobody can hard-link a file they could not read and write themselves.
func protectedHardlinks() bool {
	b, err := os.ReadFile("/proc/sys/fs/protected_hardlinks")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}
