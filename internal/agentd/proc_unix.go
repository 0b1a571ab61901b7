//go:build unix

package agentd

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"unsafe"

	"github.com/creack/pty"
)

// defaultShell runs commands on unix.
const defaultShell = "/bin/sh"

func shellArgs(command string) []string { return []string{"-c", command} }

// process is a started command, the leader of its own session (and so of
// its own process group), with every process it starts tracked by members.
type process struct {
	cmd *exec.Cmd
	// pidNum is the leader's pid. spawner is set for a command the
	// spawner started (cmd.Process is nil then), which the spawner reaps.
	// status is the leader's, once reaped.
	pidNum  int
	spawner *spawner
	status  syscall.WaitStatus
	pty     *os.File // master side; nil without a TTY
	outputs []outputPipe
	stdin   *os.File // write side of stdin: a pipe or the PTY master
	exit    *exitWatch
	members *members
	tracker *tracker
}

type outputPipe struct {
	f      *os.File
	stream uint8
}

// startProcess starts spec as the leader of a new session (with the PTY as
// controlling terminal for TTY commands), tracked by t. The session id is
// unused.
func startProcess(spec procSpec, t *tracker) (*process, error) {
	cmd := exec.Command(spec.shell, shellArgs(spec.command)...)
	cmd.Dir = spec.dir
	cmd.Env = spec.env
	attr := &syscall.SysProcAttr{Setsid: true, Setctty: spec.tty}
	if c := spec.runAs; c != nil {
		attr.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: c.Groups}
	}
	m, started, err := t.prepare(attr)
	if err != nil {
		return nil, err
	}
	registered := t.starting()
	var p *process
	if spec.tty {
		p, err = startPTY(cmd, spec, attr, t.spawn)
	} else {
		p, err = startPipes(cmd, spec, attr, t.spawn)
	}
	pid := 0
	if err == nil {
		pid = p.pidNum
		p.members, p.tracker = m, t
	}
	registered(pid)
	started(pid)
	if errors.Is(err, errSpawnerLost) {
		t.killStrays()
	}
	return p, err
}

func startPipes(cmd *exec.Cmd, spec procSpec, attr *syscall.SysProcAttr, sp *spawner) (*process, error) {
	ends, err := newPipes(cmd, spec.stdin)
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = attr
	p, err := launch(cmd, sp, spec.egress.placeOf())
	if err != nil {
		ends.closeAll()
		return nil, err
	}
	ends.started()
	p.outputs, p.stdin = ends.outputs, ends.stdin
	return p, nil
}

func startPTY(cmd *exec.Cmd, spec procSpec, attr *syscall.SysProcAttr, sp *spawner) (*process, error) {
	// As pty.StartWithAttrs does, with the start itself through launch.
	master, tty, err := pty.Open()
	if err != nil {
		return nil, err
	}
	defer tty.Close()
	if err := pty.Setsize(master, &pty.Winsize{Rows: spec.rows, Cols: spec.cols}); err != nil {
		master.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = attr
	p, err := launch(cmd, sp, spec.egress.placeOf())
	if err != nil {
		master.Close()
		return nil, err
	}
	// pty leaves the master in blocking mode (it calls Fd), where Close
	// cannot interrupt a pending Read. Re-open a non-blocking duplicate so
	// reads go through the runtime poller.
	nb, err := nonblockingDup(master)
	master.Close()
	if err != nil {
		p.exit.close()
		syscall.Kill(p.pidNum, syscall.SIGKILL)
		p.reap()
		return nil, err
	}
	p.pty, p.outputs, p.stdin = nb, []outputPipe{{f: nb, stream: streamPTY}}, nb
	return p, nil
}

// launch starts cmd through the spawner, or itself where there is none
// (or the spawner could not take it), with a pidfd to watch its exit, in
// place (nil: where agentd is).
func launch(cmd *exec.Cmd, sp *spawner, place *egressPlace) (*process, error) {
	pid, pidfd, err := sp.spawn(cmd, place)
	if err == nil {
		exit := newExitWatch(&pidfd)
		if exit == nil {
			// No way to see it end: stop it, and fail the start.
			syscall.Kill(pid, syscall.SIGKILL)
			sp.reap(pid)
			return nil, errors.New("agentd: watch a spawned command's exit")
		}
		exit.foreign = true
		return &process{cmd: cmd, pidNum: pid, spawner: sp, exit: exit}, nil
	}
	if !errors.Is(err, errSpawnerDown) {
		return nil, err
	}
	fd := watchExitAttr(cmd.SysProcAttr)
	if err := place.run(cmd.Start); err != nil {
		return nil, err
	}
	return &process{cmd: cmd, pidNum: cmd.Process.Pid, exit: newExitWatch(fd)}, nil
}

func nonblockingDup(f *os.File) (*os.File, error) {
	sc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var fd int
	var dupErr error
	if err := sc.Control(func(raw uintptr) {
		syscall.ForkLock.RLock()
		fd, dupErr = syscall.Dup(int(raw))
		if dupErr == nil {
			syscall.CloseOnExec(fd)
		}
		syscall.ForkLock.RUnlock()
	}); err != nil {
		return nil, err
	}
	if dupErr != nil {
		return nil, dupErr
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// wait waits for the command to exit and reaps it.
func (p *process) wait() {
	p.exit.wait()
	p.reap()
	p.tracker.waited(p.pidNum)
}

// reap collects the exited leader's status: through exec.Cmd for a
// command agentd started, through the spawner for one it started (the
// spawner's child, reaped only now, so its zombie kept the pid from reuse
// until agentd was done with it).
func (p *process) reap() {
	if p.spawner != nil {
		p.status = p.spawner.reap(p.pidNum)
		return
	}
	p.cmd.Wait()
	if ps := p.cmd.ProcessState; ps != nil {
		p.status, _ = ps.Sys().(syscall.WaitStatus)
	}
}

// exitCode is the reaped leader's exit code (see exitStatus).
func (p *process) exitCode() int { return exitStatus(p.status) }

// pid is the process id of the session leader, which is also its session
// and process group id.
func (p *process) pid() int { return p.pidNum }

// terminateAll asks every process of the session to stop.
func (p *process) terminateAll() { p.members.signal(syscall.SIGTERM) }

// killAll forcibly stops every process of the session.
func (p *process) killAll() { p.members.signal(syscall.SIGKILL) }

// winsize mirrors struct winsize for TIOCSWINSZ.
type winsize struct {
	rows, cols, x, y uint16
}

// resize sets the PTY window size without pty.Setsize, which would put the
// master back into blocking mode.
func (p *process) resize(rows, cols uint16) error {
	if p.pty == nil {
		return errNoTTY
	}
	sc, err := p.pty.SyscallConn()
	if err != nil {
		return err
	}
	ws := winsize{rows: rows, cols: cols}
	var errno syscall.Errno
	if err := sc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, uintptr(syscall.TIOCSWINSZ), uintptr(unsafe.Pointer(&ws)))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// exitStatus follows the shell convention: the exit status, or 128 plus
// the signal number for a process killed by a signal.
func exitStatus(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// ttySupported reports whether this platform can run TTY sessions.
const ttySupported = true
