//go:build unix && !linux

package agentd

import (
	"errors"
	"syscall"
)

// groupTracking names how sessions are tracked here.
const groupTracking = "process-group"

// signalGroup signals the leader's process group (its session too: the
// leader is a session leader whose group id is its pid).
func signalGroup(leader int, sig syscall.Signal) {
	if leader > 0 {
		syscall.Kill(-leader, sig)
	}
}

// groupAlive reports whether any process of the leader's group remains.
func groupAlive(leader int) bool {
	return leader > 0 && !errors.Is(syscall.Kill(-leader, 0), syscall.ESRCH)
}
