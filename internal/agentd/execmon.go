package agentd

import (
	"encoding/binary"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Exec reporting settings of Config.ExecReporting.
const (
	ExecReportingAuto     = "auto" // report where the kernel lets agentd
	ExecReportingDisabled = "off"  // never report
)

// execMonitor turns the kernel's process events (fork, exec, exit of every
// process of the machine) into exec records of the sessions the processes
// belong to. Attribution is agentd's own knowledge, never the shell's: a
// map from pid to session filled from fork events, starting at the
// sessions' leaders (children of agentd). Every event costs one map look-up
// (threads and processes of no session cost nothing more); an exec of a
// session's process costs reading its argv, cwd and owner from /proc,
// done at once in the loop that reads the events, so even a process that
// exits immediately is usually caught (and when not, still reported with
// argv_unavailable).
type execMonitor struct {
	self int
	// spawner's children are leaders too, while it lives (see
	// spawn_linux.go); nil: none.
	spawner atomic.Pointer[spawner]
	logger  *slog.Logger
	// inspect reads a process's argv, cwd and uid (ok false once it is
	// gone); /proc on Linux, replaced in tests.
	inspect func(pid int) (argv []string, cwd string, uid *uint32, ok bool)
	now     func() time.Time

	mu    sync.Mutex
	procs map[int]*procNode

	lost atomic.Int64 // events the kernel dropped (the socket overflowed)
	// starting counts sessions being started and not yet claimed: only
	// then can an unclaimed child of agentd be one of this server's (in a
	// process running several servers, as tests do, the others' children
	// are not read for).
	starting atomic.Int32
	// early holds the owners of agentd's children whose exit was read
	// before their claim: a fast command (`true`) can fork, exec and exit
	// before cmd.Start has returned to the claim. The claim takes its
	// owner from here, with the records read so far and exited already
	// closed; without it the claim made a fresh owner whose exit never
	// came, and the session's end waited out execRecordsGrace (2 s, about
	// one exec in a hundred under load) and lost the leader's exec record.
	early map[int]*execOwner
}

// maxEarlyExits bounds early: entries leave at their claim, so only
// children of agentd that are never claimed (another server's, in a
// process running several) could pile up.
const maxEarlyExits = 256

// procNode is one process of a session as the monitor knows it.
type procNode struct {
	owner  *execOwner
	depth  int
	ppid   int
	execed bool
	// interactive: the process runs an interactive shell (see
	// interactiveShell); shellChild: its parent is the session's leader or
	// such a shell, so it is something a person ran at a prompt.
	interactive bool
	shellChild  bool
}

// maxPendingRecords bounds the records kept for a leader agentd has
// forked but not yet claimed (the claim follows the start at once).
const maxPendingRecords = 4096

// execOwner is one session's share of the monitor: where its records go.
type execOwner struct {
	leader  int
	claimed bool
	want    bool             // records wanted; otherwise tracked for the tree only
	sink    func(ExecRecord) // called with m.mu held; must not block
	pending []ExecRecord
	exited  chan struct{} // closed once the leader's exit event was seen
	closed  bool
}

func newExecMonitor(self int, logger *slog.Logger) *execMonitor {
	return &execMonitor{self: self, logger: logger, procs: map[int]*procNode{}, now: time.Now}
}

// claim makes the process leader (just started by agentd) a session's
// leader. With want, its records (and those seen before the claim) go to
// sink; otherwise its tree is tracked without reading anything.
func (m *execMonitor) claim(leader int, want bool, sink func(ExecRecord)) *execOwner {
	m.mu.Lock()
	defer m.mu.Unlock()
	var o *execOwner
	if n := m.procs[leader]; n != nil && n.depth == 0 {
		o = n.owner
	} else if e := m.early[leader]; e != nil {
		// The leader is gone already: its fork, exec and exit were read.
		delete(m.early, leader)
		o = e
	} else {
		// The fork event is still on its way; release removes the node.
		o = newOwner(leader)
		m.procs[leader] = &procNode{owner: o}
	}
	o.claimed, o.want, o.sink = true, want, sink
	if want {
		for _, r := range o.pending {
			sink(r)
		}
	}
	o.pending = nil
	return o
}

func newOwner(leader int) *execOwner {
	return &execOwner{leader: leader, exited: make(chan struct{})}
}

// release forgets a session's leader once the session is over (its other
// processes leave the map as they exit).
func (m *execMonitor) release(o *execOwner) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := m.procs[o.leader]; n != nil && n.owner == o {
		delete(m.procs, o.leader)
	}
	o.sink, o.want = nil, false
	o.exit()
}

func (o *execOwner) exit() {
	if !o.closed {
		o.closed = true
		close(o.exited)
	}
}

// deliver hands r to o's session (or keeps it until the claim).
func (o *execOwner) deliver(r ExecRecord) {
	switch {
	case o.claimed && o.want && o.sink != nil:
		o.sink(r)
	case !o.claimed && len(o.pending) < maxPendingRecords:
		o.pending = append(o.pending, r)
	}
}

// starter reports whether pid starts sessions' leaders: agentd, or its
// spawner.
func (m *execMonitor) starter(pid int) bool {
	return pid == m.self || (pid != 0 && pid == m.spawner.Load().pid())
}

// fork handles PROC_EVENT_FORK.
func (m *execMonitor) fork(parentTgid, childPid, childTgid int) {
	if childPid != childTgid {
		return // a thread
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.starter(parentTgid) {
		// A leader agentd started (or anything else it forks: unclaimed
		// ones leave with their exit). A node already there is kept only
		// when it is this leader's own claim, made before its fork event
		// arrived: any other is a process gone with its exit event lost
		// (an overflow) whose pid the kernel gave again, and keeping it
		// would report the new leader's programs into another session.
		if n := m.procs[childTgid]; n == nil || n.depth != 0 || n.owner.leader != childTgid || !n.owner.claimed || n.owner.closed {
			m.procs[childTgid] = &procNode{owner: newOwner(childTgid), ppid: parentTgid}
		}
		delete(m.early, childTgid) // an unclaimed exit under this pid is another process's
		return
	}
	p := m.procs[parentTgid]
	if p == nil {
		// Not a session's: a node left under this pid (its exit event
		// lost to an overflow) belonged to a process that is gone.
		delete(m.procs, childTgid)
		return
	}
	m.procs[childTgid] = &procNode{owner: p.owner, depth: p.depth + 1, ppid: parentTgid, shellChild: p.depth == 0 || p.interactive}
}

// exec handles PROC_EVENT_EXEC.
func (m *execMonitor) exec(pid, tgid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.procs[tgid]
	if n == nil {
		return
	}
	first := !n.execed
	n.execed = true
	o := n.owner
	if o.claimed && !o.want || !o.claimed && m.starting.Load() == 0 {
		return
	}
	r := ExecRecord{Type: ExecRecordExec, Time: m.now().UTC(), PID: tgid, PPID: n.ppid, Depth: n.depth, First: first, ShellChild: n.shellChild}
	argv, cwd, uid, ok := m.inspect(tgid)
	if ok && len(argv) > 0 {
		r.Argv, r.ArgvTruncated = boundArgv(argv)
		r.Cwd, r.UID = cwd, uid
		n.interactive = interactiveShell(argv)
	} else {
		r.ArgvUnavailable = true
		if len(argv) > 0 {
			r.Comm = argv[0]
		}
	}
	o.deliver(r)
}

// exit handles PROC_EVENT_EXIT; status is the wait status the kernel
// reports.
func (m *execMonitor) exit(pid, tgid int, status uint32) {
	if pid != tgid {
		return // a thread
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.procs[tgid]
	if n == nil {
		return
	}
	delete(m.procs, tgid)
	o := n.owner
	switch {
	case n.depth == 0 && o.leader == tgid:
		o.exit()
		if !o.claimed && m.starter(n.ppid) && m.starting.Load() > 0 {
			m.keepEarly(tgid, o)
		}
	case n.shellChild && n.execed:
		code := waitStatusCode(status)
		o.deliver(ExecRecord{Type: ExecRecordExit, Time: m.now().UTC(), PID: tgid, PPID: n.ppid, Depth: n.depth, ShellChild: true, ExitCode: &code})
	}
}

// keepEarly keeps the owner of a child of agentd that exited before its
// claim. m.mu must be held.
func (m *execMonitor) keepEarly(leader int, o *execOwner) {
	if m.early == nil {
		m.early = map[int]*execOwner{}
	}
	if len(m.early) >= maxEarlyExits {
		for pid := range m.early { // any one: none of them is claimed soon
			delete(m.early, pid)
			break
		}
	}
	m.early[leader] = o
}

// interactiveShells are the programs that, run without a command (-c) or
// a script, read commands a person types.
var interactiveShells = map[string]bool{"sh": true, "bash": true, "rbash": true, "dash": true, "zsh": true, "ksh": true,
	"mksh": true, "oksh": true, "loksh": true, "ash": true, "yash": true, "posh": true, "fish": true, "csh": true, "tcsh": true}

// multiCallShells run the shell named by their first argument (busybox
// sh, toybox sh).
var multiCallShells = map[string]bool{"busybox": true, "toybox": true}

// shellOptionsWithArgument are the options whose next argument is their
// value, not a script: bash -o emacs, +o history, -O extglob, --rcfile
// FILE are interactive shells all the same. Missing one would let a
// person switch off the audit of what they type by starting such a shell.
var shellOptionsWithArgument = map[string]bool{"-o": true, "+o": true, "-O": true, "+O": true, "--rcfile": true, "--init-file": true}

// interactiveShell reports whether argv starts a shell that reads typed
// commands: a shell by name with options only (bash, bash -l, -zsh,
// bash -o vi, busybox sh), not bash -c '...' or sh script.sh. A person who
// starts one at a prompt (or a TTY command "bash" that sh -c forks rather
// than execs) keeps typing into it, so its children are what they ran too.
func interactiveShell(argv []string) bool {
	base := func(s string) string {
		if i := strings.LastIndexByte(s, '/'); i >= 0 {
			return s[i+1:]
		}
		return s
	}
	name, args := strings.TrimPrefix(base(argv[0]), "-"), argv[1:]
	if multiCallShells[name] {
		if len(args) == 0 {
			return false
		}
		name, args = base(args[0]), args[1:]
	}
	if !interactiveShells[name] {
		return false
	}
	stdin := false // -s: the operands are positional parameters, commands come from stdin
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--" || a == "-":
			// What follows is a script and its arguments, unless -s.
			return stdin || i+1 == len(args)
		case a == "--command": // fish -c
			return false
		case shellOptionsWithArgument[a]:
			i++
		case strings.HasPrefix(a, "--"):
			// bash's long options take no argument (--norc, --login).
		case len(a) > 1 && (a[0] == '-' || a[0] == '+'):
			if a[0] == '-' && strings.ContainsRune(a[1:], 'c') {
				return false
			}
			if strings.ContainsRune(a[1:], 's') && a[0] == '-' {
				stdin = true
			}
			// Bundled short options ending in o or O take the next
			// argument too (-lo vi).
			if last := a[len(a)-1]; last == 'o' || last == 'O' {
				i++
			}
		default:
			return stdin
		}
	}
	return true
}

// waitStatusCode turns a wait status into an exit code as a shell shows
// it: the status, or 128+signal.
func waitStatusCode(status uint32) int {
	if sig := status & 0x7f; sig != 0 {
		return 128 + int(sig)
	}
	return int(status>>8) & 0xff
}

// Process-event connector constants (linux/cn_proc.h, linux/connector.h).
const (
	cnIdxProc         = 1
	cnValProc         = 1
	procCnMcastListen = 1
	procEventFork     = 0x00000001
	procEventExec     = 0x00000002
	procEventExit     = 0x80000000
	nlmsgHdrLen       = 16
	cnMsgHdrLen       = 20
	procEventHdrLen   = 16 // what, cpu, timestamp_ns
)

// handleMessages decodes one datagram of the process-events connector
// (one or more netlink messages, each a cn_msg carrying a proc_event) and
// hands each fork, exec and exit to m. Malformed or foreign messages are
// skipped; nothing in buf is trusted for a length.
func (m *execMonitor) handleMessages(buf []byte) {
	for len(buf) >= nlmsgHdrLen {
		n := int(binary.NativeEndian.Uint32(buf[0:4]))
		if n < nlmsgHdrLen || n > len(buf) {
			return
		}
		m.handleEvent(buf[nlmsgHdrLen:n])
		// Messages are 4-byte aligned.
		n = (n + 3) &^ 3
		if n >= len(buf) {
			return
		}
		buf = buf[n:]
	}
}

func (m *execMonitor) handleEvent(msg []byte) {
	if len(msg) < cnMsgHdrLen+procEventHdrLen {
		return
	}
	if binary.NativeEndian.Uint32(msg[0:4]) != cnIdxProc || binary.NativeEndian.Uint32(msg[4:8]) != cnValProc {
		return
	}
	ev := msg[cnMsgHdrLen:]
	what := binary.NativeEndian.Uint32(ev[0:4])
	d := ev[procEventHdrLen:]
	u := func(i int) int { return int(binary.NativeEndian.Uint32(d[4*i : 4*i+4])) }
	switch what {
	case procEventFork:
		if len(d) >= 16 {
			m.fork(u(1), u(2), u(3))
		}
	case procEventExec:
		if len(d) >= 8 {
			m.exec(u(0), u(1))
		}
	case procEventExit:
		if len(d) >= 12 {
			m.exit(u(0), u(1), uint32(u(2)))
		}
	}
}
