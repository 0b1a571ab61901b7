//go:build unix

package cli

import (
	"fmt"
	"os"
	"strconv"
	"syscall"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// reexecClean replaces the process image with agentd itself (same pid, so
// PID 1 stays PID 1), run with args plus the token on a pipe and an
// environment without AGENTD_TOKEN: --token-fd naming the pipe's
// descriptor is appended to args. It returns only on failure.
func reexecClean(args []string, token string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if _, err := os.Stat("/proc/self/exe"); err == nil {
		exe = "/proc/self/exe" // the binary even if its path was replaced
	}
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		return err
	}
	// The token is far below the pipe's capacity, so this cannot block.
	if _, err := syscall.Write(p[1], []byte(token)); err != nil {
		return err
	}
	syscall.Close(p[1])
	// The read end must survive exec.
	if _, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(p[0]), syscall.F_SETFD, 0); errno != 0 {
		return errno
	}
	argv := append(append([]string{os.Args[0]}, args...), "--token-fd="+strconv.Itoa(p[0]))
	err = syscall.Exec(exe, argv, agentd.WithoutToken(os.Environ()))
	syscall.Close(p[0])
	return fmt.Errorf("exec %s: %w", exe, err)
}
