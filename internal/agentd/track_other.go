//go:build !linux

package agentd

import (
	"errors"
	"log/slog"
	"syscall"
)

// tracker finds a session's processes. Without Linux cgroups and /proc
// that is the command's process group (unix) or the command alone
// (Windows); docs/agentd-protocol.md says what escapes.
type tracker struct {
	logger   *slog.Logger
	fallback error
	spawn    *spawner // always nil: the spawner is Linux's
}

func newTracker(cfg *Config) (*tracker, error) {
	if cfg.Cgroup == CgroupRequired || cfg.SessionMemoryMax > 0 || cfg.SessionPidsMax > 0 {
		return nil, errors.New("agentd: cgroups exist only on Linux")
	}
	return &tracker{logger: cfg.Logger}, nil
}

func (t *tracker) mode() string { return groupTracking }

func (t *tracker) close() {}

// starting brackets a command's start; only Linux reaps orphans.
func (t *tracker) starting() func(pid int) { return func(int) {} }

func (t *tracker) waited(int) {}

// killStrays has nothing to do without a spawner.
func (t *tracker) killStrays() {}

// members is one session's processes: the leader's group.
type members struct{ leader int }

func (t *tracker) prepare(*syscall.SysProcAttr) (*members, func(pid int), error) {
	m := &members{}
	return m, func(pid int) { m.leader = pid }, nil
}

func (m *members) signal(sig syscall.Signal) { signalGroup(m.leader, sig) }

func (m *members) alive() bool { return groupAlive(m.leader) }

func (m *members) release() {}
