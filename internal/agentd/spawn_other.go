//go:build !linux

package agentd

import (
	"errors"
	"log/slog"
	"os/exec"
	"syscall"
)

// spawner exists on Linux only (see spawn_linux.go); elsewhere agentd
// starts commands itself.
type spawner struct{}

var (
	errSpawnerDown = errors.New("agentd: spawner unavailable")
	errSpawnerLost = errors.New("agentd: the spawner did not answer a start")
)

func startSpawner(*slog.Logger) (*spawner, error) { return nil, errSpawnerDown }

func (*spawner) spawn(*exec.Cmd, *egressPlace) (int, int, error) { return 0, -1, errSpawnerDown }

func (*spawner) reap(int) (ws syscall.WaitStatus) { return ws }

func (*spawner) pid() int { return 0 }

func (*spawner) close() {}
