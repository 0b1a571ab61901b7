package storetest

import "syscall"

// setParentDeathSignal makes the kernel send sig to the child when the
// reaper dies, so a killed reaper does not leave postgres running.
func setParentDeathSignal(a *syscall.SysProcAttr, sig syscall.Signal) {
	a.Pdeathsig = sig
}
