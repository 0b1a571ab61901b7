package agentd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// netlinkConnector is NETLINK_CONNECTOR (linux/netlink.h).
const netlinkConnector = 11

// execSocketBuffer is the receive buffer asked for: a burst of short
// processes must not overflow it while the loop reads /proc.
const execSocketBuffer = 32 << 20

// startExecMonitor subscribes to the kernel's process events. It fails
// (and agentd reports exec records as unavailable) without the privilege
// to listen (CAP_NET_ADMIN) or without the connector in the kernel.
func startExecMonitor(logger *slog.Logger) (*execMonitor, func(), error) {
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, netlinkConnector)
	if err != nil {
		return nil, nil, fmt.Errorf("open the process-events connector: %w", err)
	}
	fail := func(what string, err error) (*execMonitor, func(), error) {
		syscall.Close(fd)
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	// As root the buffer may exceed rmem_max; otherwise take what is allowed.
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, execSocketBuffer); err != nil {
		_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, execSocketBuffer)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK, Groups: cnIdxProc}); err != nil {
		return fail("subscribe to process events", err)
	}
	msg := make([]byte, nlmsgHdrLen+cnMsgHdrLen+4)
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], syscall.NLMSG_DONE)
	binary.NativeEndian.PutUint32(msg[16:], cnIdxProc)
	binary.NativeEndian.PutUint32(msg[20:], cnValProc)
	binary.NativeEndian.PutUint16(msg[32:], 4)
	binary.NativeEndian.PutUint32(msg[36:], procCnMcastListen)
	if err := syscall.Sendto(fd, msg, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return fail("start process events", err)
	}
	// A receive timeout lets the loop notice the stop without closing a
	// descriptor another thread is blocked on.
	tv := syscall.NsecToTimeval(int64(execStopCheck))
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		return fail("set the process events timeout", err)
	}
	m := newExecMonitor(os.Getpid(), logger)
	m.inspect = inspectProc
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer syscall.Close(fd)
		// The loop owns a thread of its own at the highest priority and
		// blocks in the kernel rather than in Go's poller: it wakes the
		// moment an event arrives, so it reads a short process's argv
		// before the process is gone far more often than not.
		runtime.LockOSThread()
		realtime(logger)
		buf := make([]byte, 64<<10)
		forged := false
		for !stop.Load() {
			n, from, err := syscall.Recvfrom(fd, buf, 0)
			switch {
			case err == nil && !fromKernel(from):
				// Anyone with CAP_NET_ADMIN (a root shell in a session)
				// can send to the connector's group: a forged exit of
				// the shell would make agentd forget it and report
				// nothing it runs afterwards. Only the kernel is
				// believed.
				if !forged {
					forged = true
					logger.Warn("exec reporting: ignoring process events not sent by the kernel", "sender_port", senderPort(from))
				}
			case err == nil:
				m.handleMessages(buf[:n])
			case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
			case errors.Is(err, syscall.ENOBUFS):
				// The kernel dropped events: the socket overflowed.
				m.lost.Add(1)
				logger.Warn("exec reporting: the kernel dropped process events (its buffer overflowed)")
			default:
				logger.Error("exec reporting stopped", "error", err)
				return
			}
		}
	}()
	return m, func() { stop.Store(true); <-done }, nil
}

// fromKernel reports whether a netlink datagram's sender is the kernel
// (port id 0); every socket of a user process has a port id of its own.
func fromKernel(from syscall.Sockaddr) bool {
	sa, ok := from.(*syscall.SockaddrNetlink)
	return ok && sa.Pid == 0
}

// senderPort is a datagram's sender port id, for the log.
func senderPort(from syscall.Sockaddr) int64 {
	if sa, ok := from.(*syscall.SockaddrNetlink); ok {
		return int64(sa.Pid)
	}
	return -1
}

// realtime gives the calling thread the lowest real-time priority
// (SCHED_FIFO 1): on a busy machine it then runs the moment an event
// arrives instead of waiting for a time slice, which is what decides
// whether a process that exits at once is read in time. It blocks almost
// always, and the kernel's real-time throttling bounds it anyway. Without
// the privilege it takes the highest ordinary priority instead.
func realtime(logger *slog.Logger) {
	param := struct{ priority int32 }{1}
	const schedFIFO = 1
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETSCHEDULER, uintptr(syscall.Gettid()), schedFIFO, uintptr(unsafe.Pointer(&param))); errno != 0 {
		logger.Info("exec reporting: no real-time priority for the event loop", "error", errno.Error())
		_ = syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), -20)
	}
}

// execStopCheck is how often the event loop looks whether it should stop.
const execStopCheck = 200 * time.Millisecond

// inspectProc reads what an exec record holds from /proc: argv (at most
// MaxExecArgv of it is kept, so reading a little more tells a cut), the
// working directory and the owner.
func inspectProc(pid int) (argv []string, cwd string, uid *uint32, ok bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	f, err := os.Open(dir + "/cmdline")
	if err != nil {
		return nil, "", nil, false
	}
	buf := make([]byte, MaxExecArgv+1)
	n, _ := io.ReadFull(f, buf)
	f.Close()
	argv = splitCmdline(buf[:n])
	if len(argv) == 0 {
		// Gone already (a zombie keeps its name, not its arguments).
		if comm, err := os.ReadFile(dir + "/comm"); err == nil && len(comm) > 1 {
			argv = []string{string(comm[:len(comm)-1])}
		}
		return argv, "", nil, false
	}
	cwd, _ = os.Readlink(dir + "/cwd")
	var st syscall.Stat_t
	if syscall.Stat(dir, &st) == nil {
		u := st.Uid
		uid = &u
	}
	return argv, cwd, uid, len(argv) > 0
}
