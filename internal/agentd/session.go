package agentd

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Internal errors of the process layer, translated into protocol errors by
// the handlers.
var (
	errNoTTY            = errors.New("session has no tty")
	errTTYUnsupported   = errors.New("tty unsupported on this platform")
	errRunAsUnsupported = errors.New("running commands as another user is unsupported on this platform")
)

// procSpec is what startProcess needs to run a command.
type procSpec struct {
	shell      string
	command    string
	dir        string
	env        []string
	tty        bool
	rows, cols uint16
	stdin      bool
	runAs      *Credential
	egress     *sessionEgress // the network confinement (nil: none)
}

// sessionTiming holds the durations a session needs from the server config.
type sessionTiming struct {
	killGrace  time.Duration
	drainGrace time.Duration
	pollBytes  int // data bytes one response may carry
}

// session is one command execution and its buffered output.
type session struct {
	id     string
	tty    bool
	proc   *process
	timing sessionTiming
	onEnd  func(*session) // called once, after the state is final

	stdinLock chan struct{} // one token: serialises stdin writes and close

	mu          sync.Mutex
	ring        ring
	room        sync.Cond     // signalled when a blocking ring may have room
	changed     chan struct{} // closed on new output or state change; nil until a poller waits
	state       string
	exitCode    int
	endReason   string // state to end in when a kill was requested
	aborted     bool   // producers stop waiting for room
	roomWaiters int    // producers waiting for room in a blocking ring
	lastOutput  time.Time
	stdinOpen   bool
	finishedAt  time.Time
	done        chan struct{} // closed once the state is final
	timer       *time.Timer

	ending sync.Once
	gone   chan struct{} // closed once no process of the session is left

	// exec is the session's share of the exec monitor (nil without one);
	// execLost counts records not kept because the ring was too far over
	// its limit (nobody reading), reported as one lost record.
	exec     *execOwner
	execMon  *execMonitor
	execLost int

	// egress confines the session's connections (nil without a network
	// policy); see egress_session.go.
	egress *sessionEgress
}

// memberPollEvery is how often an ending session checks whether its
// processes are gone.
const memberPollEvery = 25 * time.Millisecond

// reapBound bounds the wait for killed processes to disappear, so a
// process stuck in the kernel cannot hold the session forever.
const reapBound = 10 * time.Second

// readBufStart and readBufMax bound the per-stream read buffer, which starts
// small so idle sessions stay cheap and grows while a stream stays busy.
const (
	readBufStart = 512
	readBufMax   = 256 << 10
)

func newSession(id string, p *process, spec procSpec, ringBytes int, blocking bool, timing sessionTiming, onEnd func(*session)) *session {
	s := &session{
		id:        id,
		tty:       spec.tty,
		proc:      p,
		timing:    timing,
		onEnd:     onEnd,
		ring:      ring{max: ringBytes, blocking: blocking},
		state:     StateRunning,
		stdinOpen: p.stdin != nil,
		done:      make(chan struct{}),
		gone:      make(chan struct{}),
		stdinLock: make(chan struct{}, 1),
	}
	s.room.L = &s.mu
	return s
}

// start launches the output pumps and the reaper. timeout 0 means none.
func (s *session) start(timeout time.Duration) {
	if timeout > 0 {
		s.mu.Lock()
		s.timer = time.AfterFunc(timeout, func() { s.kill(StateTimedOut) })
		s.mu.Unlock()
	}
	// The last pump to finish closes pumpsDone; no extra goroutine waits.
	pumpsDone := make(chan struct{})
	var running atomic.Int32
	running.Store(int32(len(s.proc.outputs)))
	for _, o := range s.proc.outputs {
		go func() {
			s.pump(o)
			if running.Add(-1) == 0 {
				close(pumpsDone)
			}
		}()
	}
	go s.reap(pumpsDone)
}

// pump copies one output stream into the ring until EOF or close.
func (s *session) pump(o outputPipe) {
	// No chunk may exceed the ring, or a blocking ring would have to trim it.
	limit := min(readBufMax, s.ring.maxData())
	buf := make([]byte, min(readBufStart, limit))
	for {
		n, err := o.f.Read(buf)
		if n > 0 {
			s.appendOutput(o.stream, buf[:n]) // the ring copies it
			if n == len(buf) && len(buf) < limit {
				buf = make([]byte, min(len(buf)*8, limit))
				if len(buf) == limit {
					growPipe(o.f)
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (s *session) appendOutput(stream uint8, data []byte) {
	s.mu.Lock()
	for !s.aborted && !s.ring.fits(len(data)) {
		s.roomWaiters++
		s.room.Wait()
		s.roomWaiters--
	}
	s.lastOutput = time.Now()
	s.ring.add(stream, data)
	s.wakeLocked()
	s.mu.Unlock()
}

// appendExec adds an exec record to the output. It is called by the exec
// monitor's loop with the monitor's lock held, so it never waits: a
// blocking ring may go over its limit for records (output waits for room
// as always), up to twice its size; past that, with nobody reading,
// records are counted and reported as lost once there is room again.
func (s *session) appendExec(r ExecRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ring.blocking && s.ring.bytes > 2*s.ring.max {
		s.execLost++
		return
	}
	var data []byte
	if s.execLost > 0 {
		data = appendExecRecord(data, ExecRecord{Type: ExecRecordLost, Time: r.Time, Count: s.execLost})
		s.execLost = 0
	}
	s.ring.addExec(appendExecRecord(data, r))
	s.wakeLocked()
}

// execRecordsGrace bounds how long a session's end waits for the exec
// monitor to have read the leader's exit: the kernel queues that event
// before agentd can wait for the leader, so it is normally already there,
// and every event before it (the programs the shell ran) with it.
const execRecordsGrace = 2 * time.Second

// awaitExecRecords waits until the exec monitor has handled the leader's
// exit, so the records of what ran before it are in the output before the
// state becomes final.
func (s *session) awaitExecRecords() {
	if s.exec == nil || !s.exec.want {
		return
	}
	t := time.NewTimer(execRecordsGrace)
	defer t.Stop()
	select {
	case <-s.exec.exited:
	case <-t.C:
	}
}

// wakeLocked wakes every long-poller. s.mu must be held.
func (s *session) wakeLocked() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// reap waits for the command, lets its output drain (a background child may
// still hold the pipes: once output has been quiet for the drain grace, the
// pipes are closed), then records the final state.
func (s *session) reap(pumpsDone chan struct{}) {
	s.proc.wait()
	s.awaitExecRecords()
	code := s.proc.exitCode()
	drain := time.NewTimer(s.timing.drainGrace)
	defer drain.Stop()
	for draining := true; draining; {
		select {
		case <-pumpsDone:
			draining = false
		case <-drain.C:
			s.mu.Lock()
			// A blocking ring holds output back until pollers catch up:
			// that is not a stray child, so keep waiting while it is
			// full or still filling (unless the session was killed).
			busy := s.roomWaiters > 0 || (s.ring.blocking && time.Since(s.lastOutput) < s.timing.drainGrace)
			if busy && !s.aborted {
				s.mu.Unlock()
				drain.Reset(s.timing.drainGrace)
				continue
			}
			s.aborted = true
			s.room.Broadcast()
			s.mu.Unlock()
			for _, o := range s.proc.outputs {
				o.f.Close()
			}
			<-pumpsDone
			draining = false
		}
	}
	for _, o := range s.proc.outputs {
		o.f.Close()
	}
	s.closeStdin()
	s.egress.drain()

	s.mu.Lock()
	if s.timer != nil {
		s.timer.Stop()
	}
	s.state = StateExited
	if s.endReason != "" {
		s.state = s.endReason
	}
	s.exitCode = code
	s.finishedAt = time.Now()
	s.ring.dropSpares()
	s.aborted = true
	s.room.Broadcast()
	s.wakeLocked()
	close(s.done)
	s.mu.Unlock()
	// Whatever the command left behind ends with it.
	s.endProcesses()
	<-s.gone
	if s.exec != nil {
		s.execMon.release(s.exec)
	}
	s.onEnd(s)
}

// kill ends a running session and every process it started. reason is
// the state the session ends in.
func (s *session) kill(reason string) {
	s.mu.Lock()
	if s.state != StateRunning || s.endReason != "" {
		s.mu.Unlock()
		return
	}
	s.endReason = reason
	s.aborted = true
	s.room.Broadcast()
	s.mu.Unlock()
	s.endProcesses()
}

// endProcesses ends every process of the session, once: SIGTERM to all,
// then SIGKILL to all when the kill grace has passed and any is left. The
// grace counts for every process, not only the shell: a member trapping
// SIGTERM keeps its grace after the shell has gone. gone is closed when
// no process is left.
func (s *session) endProcesses() {
	s.ending.Do(func() {
		if !s.proc.members.alive() {
			s.proc.members.release()
			close(s.gone)
			return
		}
		go func() {
			defer close(s.gone)
			defer s.proc.members.release()
			// In the goroutine: without cgroups the first signal waits
			// for a fresh scan of /proc, which the sessions ending at
			// once (a shutdown ends them all) share only when they wait
			// for it together.
			s.proc.terminateAll()
			grace := time.NewTimer(s.timing.killGrace)
			defer grace.Stop()
			tick := time.NewTicker(memberPollEvery)
			defer tick.Stop()
			for graceLeft := true; graceLeft && s.proc.members.alive(); {
				select {
				case <-grace.C:
					graceLeft = false
				case <-tick.C:
				}
			}
			bound := time.Now().Add(reapBound)
			for s.proc.members.alive() && time.Now().Before(bound) {
				s.proc.killAll()
				<-tick.C
			}
		}()
	})
}

// release is what a poll lets go of in blocking mode: nothing (a watcher),
// or the chunks up to to (a recorder; usually its cursor, or less when it
// reads ahead of what it has stored).
type release struct {
	ack bool
	to  uint64
}

// acking releases the chunks up to cursor, as a plain poll does.
func acking(cursor uint64) release { return release{ack: true, to: cursor} }

// snapshot reads the session under its lock, first releasing what rel
// acknowledges.
func (s *session) snapshot(cursor uint64, rel release) (SessionResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshotLocked(cursor, rel)
}

func (s *session) snapshotLocked(cursor uint64, rel release) (SessionResponse, error) {
	if cursor > s.ring.lastID {
		return SessionResponse{}, newError(CodeBadRequest, "The cursor %d is ahead of the newest chunk %d.", cursor, s.ring.lastID)
	}
	if rel.ack && s.ring.ack(rel.to) {
		s.room.Broadcast()
	}
	resp := SessionResponse{
		SessionID: s.id,
		PID:       s.proc.pid(),
		TTY:       s.tty,
		State:     s.state,
	}
	res := s.ring.read(cursor, s.timing.pollBytes)
	resp.Chunks, resp.NextCursor, resp.DroppedBytes, resp.More = res.chunks, res.next, res.dropped, res.more
	resp.Truncated = resp.DroppedBytes > 0
	if s.state != StateRunning {
		code := s.exitCode
		resp.ExitCode = &code
	}
	return resp, nil
}

// poll returns the chunks after cursor as soon as there are any or the state
// is final, or when wait elapses, or when stop or cancel fire. In blocking
// mode it releases what rel acknowledges: a watcher releases nothing (it
// must not let output go that the recorder has not stored).
func (s *session) poll(cursor uint64, wait time.Duration, stop, cancel <-chan struct{}, rel release) (SessionResponse, error) {
	var timer *time.Timer
	for {
		s.mu.Lock()
		if cursor > s.ring.lastID {
			s.mu.Unlock()
			return s.snapshot(cursor, rel)
		}
		if rel.ack && s.ring.ack(rel.to) { // the producer may be waiting for room
			s.room.Broadcast()
		}
		if s.ring.lastID > cursor || s.state != StateRunning || wait <= 0 {
			resp, err := s.snapshotLocked(cursor, rel)
			s.mu.Unlock()
			return resp, err
		}
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		changed := s.changed
		s.mu.Unlock()

		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		select {
		case <-changed:
		case <-timer.C:
			return s.snapshot(cursor, rel)
		case <-stop:
			return s.snapshot(cursor, rel)
		case <-cancel:
			return s.snapshot(cursor, rel)
		}
	}
}

// writeStdin writes data and optionally closes stdin (Ctrl-D on a TTY),
// giving up at deadline. The deadline covers waiting for earlier writes
// too, so concurrent requests each answer within their own deadline.
func (s *session) writeStdin(data []byte, eof bool, deadline time.Time) error {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case s.stdinLock <- struct{}{}:
	case <-timer.C:
		return newError(CodeTimeout, "The command did not read its stdin in time.")
	}
	defer func() { <-s.stdinLock }()
	s.mu.Lock()
	open, running := s.stdinOpen, s.state == StateRunning
	s.mu.Unlock()
	if !running {
		return newError(CodeNotRunning, "The session has already ended.")
	}
	if !open {
		return newError(CodeStdinClosed, "The session's stdin is closed; create it with \"stdin\": true to write to it.")
	}
	w := s.proc.stdin
	if len(data) > 0 {
		w.SetWriteDeadline(deadline)
		if _, err := w.Write(data); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return newError(CodeTimeout, "The command did not read its stdin in time.")
			}
			return newError(CodeStdinClosed, "The command's stdin is closed.")
		}
	}
	if !eof {
		return nil
	}
	if s.tty {
		_, err := w.Write([]byte{0x04})
		if err != nil {
			return newError(CodeStdinClosed, "The terminal is closed.")
		}
		return nil
	}
	s.mu.Lock()
	s.stdinOpen = false
	s.mu.Unlock()
	return w.Close()
}

// closeStdin releases the stdin pipe once the command has ended.
func (s *session) closeStdin() {
	s.stdinLock <- struct{}{}
	defer func() { <-s.stdinLock }()
	s.mu.Lock()
	open := s.stdinOpen
	s.stdinOpen = false
	s.mu.Unlock()
	if open && !s.tty {
		s.proc.stdin.Close()
	}
}

func (s *session) resize(rows, cols uint16) error {
	if !s.tty {
		return newError(CodeNotATTY, "The session was not started with a tty.")
	}
	s.mu.Lock()
	running := s.state == StateRunning
	s.mu.Unlock()
	if !running {
		return newError(CodeNotRunning, "The session has already ended.")
	}
	if err := s.proc.resize(rows, cols); err != nil {
		return newError(CodeNotRunning, "The terminal is closed.")
	}
	return nil
}

// status is the session's state without output.
func (s *session) status() SessionResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := SessionResponse{
		SessionID:  s.id,
		PID:        s.proc.pid(),
		TTY:        s.tty,
		State:      s.state,
		Chunks:     []Chunk{},
		NextCursor: s.ring.lastID,
	}
	// A reader may continue from this cursor, so the newest chunk must not
	// grow any more.
	s.ring.serve(s.ring.lastID)
	if s.state != StateRunning {
		code := s.exitCode
		resp.ExitCode = &code
	}
	return resp
}
