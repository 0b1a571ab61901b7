//go:build linux

package agentd

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// prSetChildSubreaper is prctl's PR_SET_CHILD_SUBREAPER.
const prSetChildSubreaper = 36

// startReaping makes agentd a child subreaper and reaps every orphan it
// adopts (as PID 1 it adopts them all), so none stays a zombie.
func (t *tracker) startReaping() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return fmt.Errorf("agentd: become a child subreaper: %w", errno)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer signal.Stop(sigs)
		// SIGCHLD can coalesce; the ticker catches what a merged signal
		// left behind.
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-t.stop:
				t.reapOrphans()
				return
			case <-sigs:
			case <-tick.C:
			}
			t.reapOrphans()
		}
	}()
	return nil
}

// reapOrphans reaps exited children that agentd did not start itself.
func (t *tracker) reapOrphans() {
	t.startMu.Lock()
	defer t.startMu.Unlock()
	for _, pid := range ownChildren() {
		t.mu.Lock()
		ours := t.children[pid]
		t.mu.Unlock()
		if ours {
			continue
		}
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	}
}

// ownChildren lists agentd's child processes.
func ownChildren() []int {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil
	}
	var pids []int
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/children")
		if err != nil {
			continue
		}
		for f := range strings.FieldsSeq(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// starting brackets the start of a command: call the returned function
// with the command's pid (0 if it did not start) once it is known.
func (t *tracker) starting() func(pid int) {
	t.startMu.RLock()
	return func(pid int) {
		if pid != 0 {
			t.mu.Lock()
			t.children[pid] = true
			t.mu.Unlock()
		}
		t.startMu.RUnlock()
	}
}

// killStrays kills agentd's children that are none of its commands'
// leaders, once the spawner given up on mid-start has exited (its
// children are agentd's then): whatever the start left, which might run
// the command the client was told did not start. With cgroups the
// session's cgroup.kill does the same; without them nothing else would.
// Orphans adopted from sessions are killed too, as the process-tree
// tracking's orphan rule would at the next session's end.
func (t *tracker) killStrays() {
	if t.spawn == nil {
		return
	}
	select {
	case <-t.spawn.dead:
	case <-time.After(spawnTimeout):
		t.logger.Warn("the spawner given up on has not exited; what its last start left may run on")
		return
	}
	// Exclusively, as reapOrphans: a start under way has a child not yet
	// registered. Bounded: a start stuck in its fork holds startMu.
	for deadline := time.Now().Add(spawnTimeout); !t.startMu.TryLock(); {
		if time.Now().After(deadline) {
			t.logger.Warn("a start is stuck; what the spawner given up on left may run on")
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer t.startMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, pid := range ownChildren() {
		if !t.children[pid] {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// waited forgets a command agentd has reaped itself.
func (t *tracker) waited(pid int) {
	t.mu.Lock()
	delete(t.children, pid)
	t.mu.Unlock()
}

// groupAlive reports whether any process of the leader's group remains
// (a zombie counts until it is reaped: agentd reaps the leader, and the
// subreaper or init the members whose parent is gone).
func groupAlive(leader int) bool {
	return leader > 0 && !errors.Is(syscall.Kill(-leader, 0), syscall.ESRCH)
}
