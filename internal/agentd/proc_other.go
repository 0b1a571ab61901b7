//go:build !unix

package agentd

import (
	"os"
	"os/exec"
	"syscall"
)

// defaultShell runs commands where there is no /bin/sh.
const defaultShell = "cmd.exe"

func shellArgs(command string) []string { return []string{"/C", command} }

// process is a started command. Without unix process groups only the
// command itself can be signalled; its children may outlive it.
type process struct {
	cmd     *exec.Cmd
	outputs []outputPipe
	stdin   *os.File
	members *members
	tracker *tracker
}

type outputPipe struct {
	f      *os.File
	stream uint8
}

func startProcess(spec procSpec, t *tracker) (*process, error) {
	if spec.tty {
		return nil, errTTYUnsupported
	}
	if spec.runAs != nil {
		return nil, errRunAsUnsupported
	}
	cmd := exec.Command(spec.shell, shellArgs(spec.command)...)
	cmd.Dir = spec.dir
	cmd.Env = spec.env
	m, started, err := t.prepare(nil)
	if err != nil {
		return nil, err
	}
	ends, err := newPipes(cmd, spec.stdin)
	if err != nil {
		return nil, err
	}
	registered := t.starting()
	if err := cmd.Start(); err != nil {
		registered(0)
		ends.closeAll()
		return nil, err
	}
	registered(cmd.Process.Pid)
	started(cmd.Process.Pid)
	ends.started()
	return &process{cmd: cmd, members: m, tracker: t, outputs: ends.outputs, stdin: ends.stdin}, nil
}

func (p *process) wait() {
	p.cmd.Wait()
	p.tracker.waited(p.cmd.Process.Pid)
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// terminateAll kills the command: Windows has no SIGTERM to send.
func (p *process) terminateAll() { p.members.signal(syscall.SIGKILL) }

func (p *process) killAll() { p.members.signal(syscall.SIGKILL) }

// groupTracking names how sessions are tracked here: the command alone.
const groupTracking = "process"

// signalGroup kills the command; its children are not tracked here.
func signalGroup(pid int, _ syscall.Signal) {
	if p, err := os.FindProcess(pid); err == nil {
		p.Kill()
	}
}

// groupAlive is false: nothing but the command itself is tracked, and the
// session waits for that separately.
func groupAlive(int) bool { return false }

func (p *process) resize(rows, cols uint16) error { return errNoTTY }

func (p *process) exitCode() int { return p.cmd.ProcessState.ExitCode() }

// ttySupported reports whether this platform can run TTY sessions.
const ttySupported = false
