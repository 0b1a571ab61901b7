//go:build linux

package agentd

import (
	"errors"
	"log/slog"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestSpawnerForgetsItsPidAtExit: once the helper has exited its pid is
// nobody's here (exec reporting and the process-tree scans stop treating
// it as the spawner before it is reaped and the pid can be reused), its
// requests fail as "down" so agentd starts commands itself, and close
// returns.
func TestSpawnerForgetsItsPidAtExit(t *testing.T) {
	sp, err := startSpawner(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	pid := sp.pid()
	if pid == 0 {
		t.Fatal("no pid for a running spawner")
	}
	m := newExecMonitor(1, slog.New(slog.DiscardHandler))
	m.spawner.Store(sp)
	if !m.starter(pid) {
		t.Fatal("the exec monitor does not know the spawner")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sp.dead:
	case <-time.After(10 * time.Second):
		t.Fatal("the spawner's exit was not seen")
	}
	if sp.pid() != 0 || m.starter(pid) {
		t.Fatalf("after its exit the spawner's pid is %d and starts leaders: %v", sp.pid(), m.starter(pid))
	}
	cmd := exec.Command("/bin/true")
	cmd.Env = []string{}
	if _, _, err := sp.spawn(cmd, nil); !errors.Is(err, errSpawnerDown) {
		t.Fatalf("a start through the dead spawner: %v, want it down", err)
	}
}
