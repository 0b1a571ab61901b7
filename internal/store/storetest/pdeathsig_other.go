//go:build unix && !linux

package storetest

import "syscall"

// setParentDeathSignal is Linux-only; elsewhere a server left by a killed
// reaper is stopped by the next run (cleanupStale).
func setParentDeathSignal(*syscall.SysProcAttr, syscall.Signal) {}
