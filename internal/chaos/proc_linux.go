package chaos

import "syscall"

// dieWithParent makes a child get SIGKILL when the process that started
// it ends, however it ends.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
