//go:build linux

package agentd

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Why a spawner. A fork copies the parent's descriptor table and the exec
// that follows closes every close-on-exec descriptor in it, one by one:
// agentd holds three or four per running session (its output pipes, its
// stdin pipe if it has one, and pidfds), so with 2,000 sessions each
// command start cost milliseconds more (BenchmarkExecBesideSessions). The
// spawner is agentd re-executed as a helper that holds a
// handful of descriptors: agentd sends it a command with the child's
// stdio (and cgroup) descriptors over a socket, it starts the command
// (CLONE_INTO_CGROUP as before) and sends back its pid and pidfd. The
// command is the helper's child, so the helper reaps it, when agentd asks
// (after the pidfd said it exited): until then its zombie keeps its pid
// and process group from reuse, as when agentd was the parent. (The
// command cannot be made agentd's child with CLONE_PARENT: clone3, which
// CLONE_INTO_CGROUP needs, refuses it with an exit signal, and Go's
// clone3 always sets one.) If the helper dies, its children are adopted
// by agentd, a subreaper, which then reaps them itself; new commands are
// started by agentd itself.

// spawnerArg0 and spawnerEnv mark the helper's process: both must be set,
// so no ordinary run of a binary holding this package turns into one.
const (
	spawnerArg0 = "agentd-spawner"
	spawnerEnv  = "GATEHOUSE_AGENTD_SPAWNER=1"
	spawnerFD   = 3 // the helper's end of the socket
	// maxSpawnMessage bounds one request; a larger one (a huge
	// environment) is started by agentd itself.
	maxSpawnMessage = 192 << 10
)

func init() {
	if len(os.Args) == 1 && os.Args[0] == spawnerArg0 && len(os.Environ()) == 1 && os.Environ()[0] == spawnerEnv {
		// Non-dumpable before anything else, as agentd is (the exec that
		// made this process reset it): a command of agentd's own
		// non-root user could otherwise ptrace the helper or take its
		// socket with pidfd_getfd, and start, see or answer for other
		// sessions' commands. The helper starts with agentd, before any
		// session exists, so no command can reach it before this line.
		if SetNonDumpable() != nil {
			os.Exit(1)
		}
		os.Exit(serveSpawns(spawnerFD))
	}
}

// How long agentd waits for the helper's answer before it gives up on the
// helper (kills it, and does the work itself from then on): a reap is
// instant, a start a fork and an exec. A start held up longer (a child
// stopped between its fork and its exec by a command of the run-as user,
// a working directory on a hung mount) must not hold every other start
// and every reap behind it.
const (
	spawnTimeout = 10 * time.Second
	reapTimeout  = 2 * time.Second
)

// errSpawnerDown means the spawner could not take the request: nothing was
// started, and agentd starts the command itself.
var errSpawnerDown = errors.New("agentd: spawner unavailable")

// errSpawnerLost means the spawner took a start and was given up on before
// it answered: whether it forked is unknown (see tracker.killStrays).
var errSpawnerLost = errors.New("agentd: the spawner did not answer a start")

// spawnRequest asks the helper to start a command (Op "spawn": its stdin,
// stdout and stderr, with UseCgroupFD the session's cgroup directory, and
// with NetNS the session's network namespace travel as descriptors beside
// it, in that order) or to reap one (Op "reap"). ConnectPort starts the
// command under Landlock, connecting over TCP to that port only.
type spawnRequest struct {
	Op          string              `json:"op"`
	Pid         int                 `json:"pid,omitempty"`
	Path        string              `json:"path,omitempty"`
	Args        []string            `json:"args,omitempty"`
	Env         []string            `json:"env,omitempty"`
	Dir         string              `json:"dir,omitempty"`
	Setsid      bool                `json:"setsid,omitempty"`
	Setctty     bool                `json:"setctty,omitempty"`
	Ctty        int                 `json:"ctty,omitempty"`
	Credential  *syscall.Credential `json:"credential,omitempty"`
	UseCgroupFD bool                `json:"use_cgroup_fd,omitempty"`
	NetNS       bool                `json:"netns,omitempty"`
	ConnectPort int                 `json:"connect_port,omitempty"`
}

// spawnReply is the helper's answer: a started command's pid (its pidfd
// travels beside it), a reaped one's wait status, or the errno of what
// failed.
type spawnReply struct {
	Pid    int    `json:"pid,omitempty"`
	Status uint32 `json:"status,omitempty"`
	Errno  int    `json:"errno,omitempty"`
}

const (
	opSpawn = "spawn"
	opReap  = "reap"
)

// spawner is agentd's side of the helper. One request is in flight at a
// time: a start is a fork and an exec, short, and the helper forks one
// after the other anyway.
type spawner struct {
	logger *slog.Logger
	mu     sync.Mutex
	fd     int // agentd's end of the socket; -1 once the helper is gone
	proc   *os.Process
	null   *os.File // stdin of commands without one
	// live is the helper's pid while it runs, 0 from its exit on (before
	// it is reaped, so its pid is never another process's here); dead is
	// closed then, when its children have been handed to agentd.
	live atomic.Int64
	dead chan struct{}
	// reaped, when set, is told the helper's pid once it is reaped.
	reaped func(pid int)
}

// startSpawner starts the helper (nil and an error if it cannot).
func startSpawner(logger *slog.Logger) (*spawner, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spawner socket: %w", err)
	}
	for _, fd := range fds {
		_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF, maxSpawnMessage+(16<<10))
		_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, maxSpawnMessage+(16<<10))
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		return nil, err
	}
	helper := os.NewFile(uintptr(fds[1]), "spawner")
	// No Pdeathsig: it fires when the thread that forked the helper
	// exits, not agentd. The helper exits when its socket closes, which
	// agentd's end does, exiting or crashing.
	proc, err := os.StartProcess("/proc/self/exe", []string{spawnerArg0}, &os.ProcAttr{
		Env:   []string{spawnerEnv},
		Files: []*os.File{null, os.Stderr, os.Stderr, helper},
	})
	helper.Close()
	if err != nil {
		syscall.Close(fds[0])
		null.Close()
		return nil, fmt.Errorf("start the spawner: %w", err)
	}
	s := &spawner{logger: logger, fd: fds[0], proc: proc, null: null, dead: make(chan struct{})}
	s.live.Store(int64(proc.Pid))
	go s.watch()
	return s, nil
}

// watch waits for the helper's exit: it forgets the helper's pid first,
// then reaps it (its children are agentd's by then: the kernel hands them
// over before the exit shows) and closes dead.
func (s *spawner) watch() {
	defer close(s.dead)
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(s.proc.Pid), uintptr(unsafe.Pointer(&info[0])),
			syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		if errno != syscall.EINTR {
			break
		}
	}
	s.live.Store(0)
	_, _ = s.proc.Wait()
	if s.reaped != nil {
		s.reaped(s.proc.Pid)
	}
	s.mu.Lock()
	if s.fd >= 0 {
		s.brokenLocked(errors.New("the helper exited"))
	}
	s.mu.Unlock()
}

// pPID is waitid's idtype for one pid.
const pPID = 1

// spawn starts cmd through the helper, in place (nil: where the helper
// is), and returns its pid and pidfd. An error wrapping errSpawnerDown
// means nothing was started.
func (s *spawner) spawn(cmd *exec.Cmd, place *egressPlace) (int, int, error) {
	if s == nil || cmd.Err != nil || len(cmd.ExtraFiles) > 0 || cmd.Env == nil {
		return 0, -1, errSpawnerDown
	}
	stdio := []any{cmd.Stdin, cmd.Stdout, cmd.Stderr}
	fds := make([]int, 0, 4)
	for _, f := range stdio {
		switch f := f.(type) {
		case nil:
			fds = append(fds, int(s.null.Fd()))
		case *os.File:
			fds = append(fds, int(f.Fd()))
		default:
			return 0, -1, errSpawnerDown
		}
	}
	req := spawnRequest{Op: opSpawn, Path: cmd.Path, Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir}
	if a := cmd.SysProcAttr; a != nil {
		// What the helper does not pass on (a parent-death signal would
		// follow the helper's thread, not agentd) is started by agentd.
		if a.Chroot != "" || a.Cloneflags != 0 || a.Unshareflags != 0 || a.Setpgid || a.Foreground || a.Noctty || a.Ptrace ||
			a.UidMappings != nil || a.GidMappings != nil || a.AmbientCaps != nil || a.PidFD != nil || a.Pdeathsig != 0 {
			return 0, -1, errSpawnerDown
		}
		req.Setsid, req.Setctty, req.Ctty, req.Credential = a.Setsid, a.Setctty, a.Ctty, a.Credential
		if a.UseCgroupFD {
			req.UseCgroupFD = true
			fds = append(fds, a.CgroupFD)
		}
	}
	if place != nil {
		if place.netns >= 0 {
			req.NetNS = true
			fds = append(fds, place.netns)
		}
		req.ConnectPort = place.connectPort
	}
	msg, err := json.Marshal(req)
	if err != nil || len(msg) > maxSpawnMessage {
		return 0, -1, errSpawnerDown
	}
	var reply spawnReply
	pidfd, err := s.call(msg, fds, &reply, spawnTimeout)
	runtime.KeepAlive(stdio) // their descriptors were sent by number
	if err != nil {
		return 0, -1, err
	}
	if reply.Errno != 0 {
		return 0, -1, &os.PathError{Op: "fork/exec", Path: cmd.Path, Err: syscall.Errno(reply.Errno)}
	}
	if reply.Pid <= 0 || pidfd < 0 {
		return 0, -1, errors.New("agentd: spawner: an answer without a pid")
	}
	return reply.Pid, pidfd, nil
}

// reap reaps pid, a command the helper started that has exited, and
// returns its wait status. With the helper gone (or given up on), its
// children are agentd's (a subreaper adopts them) and agentd reaps pid
// itself.
func (s *spawner) reap(pid int) syscall.WaitStatus {
	msg, _ := json.Marshal(spawnRequest{Op: opReap, Pid: pid})
	for {
		var reply spawnReply
		_, err := s.call(msg, nil, &reply, reapTimeout)
		switch {
		case err == nil && reply.Errno == 0:
			return syscall.WaitStatus(reply.Status)
		case err == nil && reply.Errno == int(syscall.EAGAIN):
			// Not exited yet, though its pidfd said so: ask again.
			time.Sleep(10 * time.Millisecond)
			continue
		case err == nil:
			return s.lost(pid, syscall.Errno(reply.Errno))
		}
		break
	}
	// Once the helper's exit shows, its children are agentd's.
	<-s.dead
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return s.lost(pid, err)
		}
		return ws
	}
}

// lost is the status reported for pid when nothing can tell its own: as
// if killed (137), and said in the log.
func (s *spawner) lost(pid int, err error) syscall.WaitStatus {
	s.logger.Warn("the exit status of a command is lost", "pid", pid, "error", err)
	return syscall.WaitStatus(syscall.SIGKILL)
}

// call sends one request with fds and reads its answer (and the pidfd
// beside it, -1 with none). An error wrapping errSpawnerDown means the
// request never reached the helper.
func (s *spawner) call(msg []byte, fds []int, reply *spawnReply, timeout time.Duration) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd < 0 {
		return -1, errSpawnerDown
	}
	var rights []byte
	if len(fds) > 0 {
		rights = syscall.UnixRights(fds...)
	}
	if err := syscall.Sendmsg(s.fd, msg, rights, nil, syscall.MSG_NOSIGNAL); err != nil {
		// Nothing reached the helper: agentd does the work itself.
		s.brokenLocked(fmt.Errorf("send: %w", err))
		return -1, fmt.Errorf("%w: %v", errSpawnerDown, err)
	}
	pidfd, err := s.readReplyLocked(reply, timeout)
	if err != nil {
		// The helper took the request and did not answer as it should:
		// whether it forked is unknown, so this start fails rather than
		// run twice (a child it made is agentd's once the helper is
		// killed here, and ends with its session's cgroup, or as an
		// orphan without cgroups).
		s.brokenLocked(err)
		return -1, fmt.Errorf("%w: %v", errSpawnerLost, err)
	}
	return pidfd, nil
}

// pid is the helper's pid (0 without one), whose children are sessions'
// leaders.
func (s *spawner) pid() int {
	if s == nil {
		return 0
	}
	return int(s.live.Load())
}

// readReplyLocked reads one answer and its pidfd (-1 with none), waiting
// at most timeout for it. A malformed answer naming a started command
// kills that command: nothing would track it.
func (s *spawner) readReplyLocked(reply *spawnReply, timeout time.Duration) (int, error) {
	if err := waitReadable(s.fd, timeout); err != nil {
		return -1, err
	}
	buf := make([]byte, 256)
	oob := make([]byte, syscall.CmsgSpace(4))
	for {
		n, oobn, flags, _, err := syscall.Recvmsg(s.fd, buf, oob, syscall.MSG_CMSG_CLOEXEC|syscall.MSG_DONTWAIT)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("read the answer: %w", err)
		}
		if n == 0 {
			return -1, errors.New("the helper is gone")
		}
		fds, perr := parseRights(oob[:oobn])
		derr := json.Unmarshal(buf[:n], reply)
		switch {
		case perr == nil && derr == nil && flags&(syscall.MSG_CTRUNC|syscall.MSG_TRUNC) == 0 &&
			reply.Errno == 0 && reply.Pid > 0 && len(fds) == 1:
			return fds[0], nil
		case perr == nil && derr == nil && flags&(syscall.MSG_CTRUNC|syscall.MSG_TRUNC) == 0 &&
			(reply.Errno != 0 || reply.Pid == 0) && len(fds) == 0:
			return -1, nil
		}
		closeAll(fds)
		if derr == nil && reply.Pid > 0 {
			syscall.Kill(reply.Pid, syscall.SIGKILL)
		}
		return -1, fmt.Errorf("a malformed answer (%d descriptors, flags %#x, %v, %v)", len(fds), flags, perr, derr)
	}
}

// waitReadable waits until fd has something to read, at most timeout.
func waitReadable(fd int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("no answer within %s", timeout)
		}
		ok, err := pollIn(fd, left)
		switch {
		case errors.Is(err, syscall.EINTR):
		case err != nil:
			return fmt.Errorf("wait for the answer: %w", err)
		case ok:
			return nil
		}
	}
}

// brokenLocked stops using the helper after err.
func (s *spawner) brokenLocked(err error) {
	s.logger.Warn("the spawner failed; agentd starts commands itself from now on", "error", err)
	syscall.Close(s.fd)
	s.fd = -1
	// Killed even if stuck in a fork (a vfork's wait is killable); watch
	// reaps it.
	_ = s.proc.Kill()
}

// close stops the helper: it exits when its socket closes, and watch
// reaps it.
func (s *spawner) close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.fd >= 0 {
		syscall.Close(s.fd)
		s.fd = -1
	}
	s.mu.Unlock()
	select {
	case <-s.dead:
	case <-time.After(reapTimeout):
		_ = s.proc.Kill()
		<-s.dead
	}
	s.null.Close()
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse descriptors: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		rights, err := syscall.ParseUnixRights(&m)
		if err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("parse descriptors: %w", err)
		}
		fds = append(fds, rights...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

// serveSpawns is the helper: it starts each command it is sent, answering
// with its pid and pidfd, and reaps each one agentd asks it to. It returns
// when agentd closes the socket.
func serveSpawns(fd int) int {
	// Inherited without close-on-exec; the commands must not inherit it.
	syscall.CloseOnExec(fd)
	buf := make([]byte, maxSpawnMessage+1)
	oob := make([]byte, syscall.CmsgSpace(5*4)) // stdio, cgroup, netns
	for {
		n, oobn, _, _, err := syscall.Recvmsg(fd, buf, oob, syscall.MSG_CMSG_CLOEXEC)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return 0
		}
		fds, err := parseRights(oob[:oobn])
		reply := spawnReply{Errno: int(syscall.EINVAL)}
		pidfd := -1
		var req spawnRequest
		switch {
		case err != nil || json.Unmarshal(buf[:n], &req) != nil:
		case req.Op == opReap && len(fds) == 0 && req.Pid > 0:
			reply = reapChild(req.Pid)
		case req.Op == opSpawn && len(fds) == 3+boolInt(req.UseCgroupFD)+boolInt(req.NetNS):
			reply = startChild(req, fds, &pidfd)
		}
		closeAll(fds)
		msg, _ := json.Marshal(reply)
		var rights []byte
		if pidfd >= 0 {
			rights = syscall.UnixRights(pidfd)
		}
		err = syscall.Sendmsg(fd, msg, rights, nil, syscall.MSG_NOSIGNAL)
		if pidfd >= 0 {
			syscall.Close(pidfd)
		}
		if err != nil {
			return 1
		}
	}
}

// startChild starts req with fds as its stdio (and cgroup), setting
// *pidfd.
func startChild(req spawnRequest, fds []int, pidfd *int) spawnReply {
	sys := &syscall.SysProcAttr{Setsid: req.Setsid, Setctty: req.Setctty, Ctty: req.Ctty, Credential: req.Credential, PidFD: pidfd}
	if req.UseCgroupFD {
		sys.UseCgroupFD, sys.CgroupFD = true, fds[3]
	}
	attr := &syscall.ProcAttr{Dir: req.Dir, Env: req.Env, Files: []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])}, Sys: sys}
	place := &egressPlace{netns: -1, connectPort: req.ConnectPort}
	if req.NetNS {
		place.netns = fds[3+boolInt(req.UseCgroupFD)]
	}
	var pid int
	err := place.run(func() (err error) {
		pid, err = syscall.ForkExec(req.Path, req.Args, attr)
		return err
	})
	if err != nil {
		*pidfd = -1
		return spawnReply{Errno: errnoOf(err)}
	}
	return spawnReply{Pid: pid}
}

// errnoOf is err's errno (EIO for an error that is none).
func errnoOf(err error) int {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return int(errno)
	}
	return int(syscall.EIO)
}

// reapChild reaps an exited child.
func reapChild(pid int) spawnReply {
	var ws syscall.WaitStatus
	for {
		// WNOHANG: agentd asks only once the pidfd said the child
		// exited, and the helper must never block on one.
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		switch {
		case err == nil && got == 0:
			return spawnReply{Errno: int(syscall.EAGAIN)}
		case err == nil:
			return spawnReply{Status: uint32(ws)}
		case !errors.Is(err, syscall.EINTR):
			return spawnReply{Errno: errnoOf(err)}
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
