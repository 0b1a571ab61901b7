//go:build !linux

package chaos

import "syscall"

// dieWithParent is Linux's Pdeathsig elsewhere: not available, so a run
// that dies may leave its replicas behind.
func dieWithParent() *syscall.SysProcAttr { return nil }
