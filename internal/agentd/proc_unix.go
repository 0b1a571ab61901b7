//go:build unix

package agentd

import (
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
	cmd     *exec.Cmd
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
		p, err = startPTY(cmd, spec, attr)
	} else {
		p, err = startPipes(cmd, spec, attr)
	}
	pid := 0
	if err == nil {
		pid = cmd.Process.Pid
		p.members, p.tracker = m, t
	}
	registered(pid)
	started(pid)
	return p, err
}

func startPipes(cmd *exec.Cmd, spec procSpec, attr *syscall.SysProcAttr) (*process, error) {
	ends, err := newPipes(cmd, spec.stdin)
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = attr
	pidfd := watchExitAttr(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		ends.closeAll()
		return nil, err
	}
	ends.started()
	return &process{cmd: cmd, outputs: ends.outputs, stdin: ends.stdin, exit: newExitWatch(pidfd)}, nil
}

func startPTY(cmd *exec.Cmd, spec procSpec, attr *syscall.SysProcAttr) (*process, error) {
	ws := &pty.Winsize{Rows: spec.rows, Cols: spec.cols}
	pidfd := watchExitAttr(attr)
	master, err := pty.StartWithAttrs(cmd, ws, attr)
	if err != nil {
		return nil, err
	}
	exit := newExitWatch(pidfd)
	// pty leaves the master in blocking mode (it calls Fd), where Close
	// cannot interrupt a pending Read. Re-open a non-blocking duplicate so
	// reads go through the runtime poller.
	nb, err := nonblockingDup(master)
	master.Close()
	if err != nil {
		exit.close()
		cmd.Process.Kill()
		cmd.Wait()
		return nil, err
	}
	return &process{
		cmd:     cmd,
		pty:     nb,
		outputs: []outputPipe{{f: nb, stream: streamPTY}},
		stdin:   nb,
		exit:    exit,
	}, nil
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
	p.cmd.Wait()
	p.tracker.waited(p.cmd.Process.Pid)
}

// pid is the process id of the session leader, which is also its session
// and process group id.
func (p *process) pid() int { return p.cmd.Process.Pid }

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

// exitCode follows the shell convention: the exit status, or 128 plus the
// signal number for a process killed by a signal.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// ttySupported reports whether this platform can run TTY sessions.
const ttySupported = true
