//go:build unix && !linux

package agentd

import "syscall"

// exitWatch is unavailable without pidfds; Wait then holds a thread.
type exitWatch struct{ foreign bool }

func watchExitAttr(*syscall.SysProcAttr) *int { return nil }

func newExitWatch(*int) *exitWatch { return nil }

func (w *exitWatch) wait() {}

func (w *exitWatch) close() {}
