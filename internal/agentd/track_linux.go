//go:build linux

package agentd

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// tracker finds every process a session started, whatever the process does
// to leave: on Linux a cgroup v2 per session where agentd can create one
// (nothing a process does inside can take it out), otherwise the session's
// process tree, session id and process group, learned by scanning /proc.
type tracker struct {
	logger    *slog.Logger
	parent    string // cgroup holding one cgroup per session; "" without cgroups
	limits    cgroupLimits
	subreaper bool // orphans agentd adopts are escapees of its sessions
	self      int
	fallback  error    // why there are no cgroups in CgroupAuto mode
	spawn     *spawner // starts commands (nil: agentd does; see spawn_linux.go)

	mu       sync.Mutex
	sessions map[*members]bool    // running fallback sessions, for attribution
	learned  map[procKey]*members // processes seen in a session's tree
	children map[int]bool         // commands agentd started and will wait for
	// startMu is held shared while commands start and exclusively while
	// orphans are reaped, so the reaper never reaps a command agentd
	// started but has not registered in children yet.
	startMu sync.RWMutex
	// scanMu serializes scans; scanStarts numbers them as they start and
	// scanDone is the number of the last one finished (both under mu), so
	// callers asking for a fresh scan at once share one (rescan).
	scanMu     sync.Mutex
	scanStarts uint64
	scanDone   uint64
	stop       chan struct{}
	wg         sync.WaitGroup
}

// cgroupLimits are optional per-session cgroup limits (0: none).
type cgroupLimits struct {
	memoryMax int64
	pidsMax   int64
}

// procKey names a process across pid reuse.
type procKey struct {
	pid   int
	start uint64
}

// scanEvery is how often the fallback learns which processes belong to
// which session. A process that escapes both the session's process tree
// and its session id within one interval is only caught by the orphan rule
// (see kill).
const scanEvery = 100 * time.Millisecond

func newTracker(cfg *Config) (*tracker, error) {
	t := &tracker{
		logger:    cfg.Logger,
		limits:    cgroupLimits{memoryMax: cfg.SessionMemoryMax, pidsMax: cfg.SessionPidsMax},
		subreaper: cfg.Subreaper,
		self:      os.Getpid(),
		sessions:  make(map[*members]bool),
		learned:   make(map[procKey]*members),
		children:  make(map[int]bool),
		stop:      make(chan struct{}),
	}
	if cfg.Cgroup != CgroupOff {
		parent, err := setupCgroup(cfg.CgroupParent, t.limits)
		switch {
		case err == nil:
			t.parent = parent
		case cfg.Cgroup == CgroupRequired || t.limits != (cgroupLimits{}):
			return nil, fmt.Errorf("agentd: cgroup: %w", err)
		default:
			t.fallback = err
		}
	}
	// The spawner needs the subreaper: if it dies, agentd adopts and
	// reaps the commands it started. Started before the reaper and the
	// scanner, which look for it.
	if cfg.Spawner && t.subreaper {
		sp, err := startSpawner(t.logger)
		if err != nil {
			t.logger.Warn("no spawner: agentd starts commands itself, each start slower the more sessions run", "error", err)
		} else {
			// The spawner reaps the helper itself (see spawner.watch),
			// and forgets it here once it has.
			t.children[sp.proc.Pid] = true
			sp.reaped = t.waited
		}
		t.spawn = sp
	}
	if t.subreaper {
		if err := t.startReaping(); err != nil {
			t.spawn.close()
			return nil, err
		}
	}
	if t.parent == "" {
		t.wg.Add(1)
		go t.scanLoop()
	}
	return t, nil
}

// mode names the tracking in use, for logs and health.
func (t *tracker) mode() string {
	if t.parent != "" {
		return "cgroup"
	}
	return "process-tree"
}

// close stops the scanner and removes the cgroup parent (once empty).
func (t *tracker) close() {
	select {
	case <-t.stop:
	default:
		close(t.stop)
	}
	t.wg.Wait()
	t.spawn.close()
	if t.parent == "" {
		// What the sessions' ends left outside their groups (the scans
		// that would find it no longer run) is killed now.
		t.mu.Lock()
		busy := len(t.sessions) > 0
		t.mu.Unlock()
		if busy {
			t.scanAndSweep()
			if t.subreaper {
				t.reapOrphans()
			}
		}
		return
	}
	// Processes killed just now leave their cgroups once reaped.
	err := removeCgroupTree(t.parent)
	for i := 0; i < 20 && errors.Is(err, syscall.EBUSY); i++ {
		time.Sleep(50 * time.Millisecond)
		if t.subreaper {
			t.reapOrphans()
		}
		err = removeCgroupTree(t.parent)
	}
	if err != nil {
		t.logger.Warn("remove cgroup", "path", t.parent, "error", err)
	}
}

// members is one session's set of processes.
type members struct {
	t      *tracker
	cgroup string // the session's cgroup; "" in the fallback
	leader procKey
	// In the fallback, guarded by t.mu: known are the processes the scans
	// attributed to the session (so signalling and checking it cost its
	// own processes, not a scan of every process); ended says the session
	// was released, and sweeps is how many scans have looked for its
	// leftovers since.
	known  map[procKey]struct{}
	ended  bool
	sweeps int
	// lastSig is the signal last sent to the session's processes.
	lastSig syscall.Signal
}

// prepare readies tracking for a session about to start with attr: in
// cgroup mode the command is born inside its cgroup (clone3 with
// CLONE_INTO_CGROUP), so not even its first instruction runs outside. The
// returned function finishes the setup once the leader's pid is known (0:
// the start failed).
func (t *tracker) prepare(attr *syscall.SysProcAttr) (*members, func(pid int), error) {
	m := &members{t: t, known: make(map[procKey]struct{})}
	if t.parent == "" {
		return m, func(pid int) {
			if pid == 0 {
				return
			}
			m.leader = procKey{pid: pid, start: procStart(pid)}
			t.mu.Lock()
			t.sessions[m] = true
			t.mu.Unlock()
		}, nil
	}
	// Not named after the session id: a client-chosen id may be reused
	// while the cgroup of its previous session is still being removed.
	dir := filepath.Join(t.parent, "s-"+newSessionID())
	err := os.Mkdir(dir, 0o755)
	if errors.Is(err, os.ErrNotExist) {
		// Another agentd (in another PID namespace) took agentd's empty
		// cgroup for a stale one: make it again.
		if err = os.Mkdir(t.parent, 0o755); err == nil || errors.Is(err, os.ErrExist) {
			err = os.Mkdir(dir, 0o755)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("create session cgroup: %w", err)
	}
	for file, v := range map[string]int64{"memory.max": t.limits.memoryMax, "pids.max": t.limits.pidsMax} {
		if v <= 0 {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(v, 10)), 0); err != nil {
			os.Remove(dir)
			return nil, nil, fmt.Errorf("set %s: %w", file, err)
		}
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		os.Remove(dir)
		return nil, nil, fmt.Errorf("open session cgroup: %w", err)
	}
	attr.UseCgroupFD = true
	attr.CgroupFD = fd
	m.cgroup = dir
	return m, func(pid int) {
		syscall.Close(fd)
		if pid == 0 {
			// A start that failed may have left a child in the cgroup (a
			// spawner given up on mid-fork): kill it, then remove the
			// cgroup once it is empty.
			_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
			if os.Remove(dir) != nil {
				go t.removeLater(dir)
			}
			return
		}
		m.leader = procKey{pid: pid}
	}, nil
}

// signal sends sig to every process of the session.
func (m *members) signal(sig syscall.Signal) {
	if m.cgroup != "" {
		if sig == syscall.SIGKILL {
			// cgroup.kill kills every member at once, including ones
			// forked while it runs.
			if err := os.WriteFile(filepath.Join(m.cgroup, "cgroup.kill"), []byte("1"), 0); err == nil {
				return
			}
		}
		for _, pid := range m.cgroupPids() {
			syscall.Kill(pid, sig)
		}
		return
	}
	// The whole group first (it holds most members, and ones born since
	// the last scan), then every process the scans attributed to the
	// session. One born since the last scan outside the group (setsid,
	// its parent gone) is found by the scan after the session's release,
	// which kills what an ended session left (sweepEnded).
	m.t.mu.Lock()
	first := m.lastSig != sig
	m.lastSig = sig
	m.t.mu.Unlock()
	if first {
		// Learn the processes born since the last scan while their
		// parents still run (a setsid child whose parent is killed next
		// is otherwise nobody's): one scan shared by every session
		// signalled at once (a shutdown signals them all).
		m.t.rescan()
	}
	syscall.Kill(-m.leader.pid, sig)
	for _, pid := range m.liveKnown() {
		syscall.Kill(pid, sig)
	}
}

// liveKnown lists the processes the scans attributed to m that still run
// (the same process: its start time is checked, against pid reuse).
func (m *members) liveKnown() []int {
	m.t.mu.Lock()
	keys := make([]procKey, 0, len(m.known))
	for k := range m.known {
		keys = append(keys, k)
	}
	m.t.mu.Unlock()
	var pids []int
	for _, k := range keys {
		if info, ok := readProc(k.pid); ok && info.start == k.start && !info.zombie {
			pids = append(pids, k.pid)
		}
	}
	return pids
}

// alive reports whether any process of the session still runs (zombies
// do not count: they are dead and only wait to be reaped).
func (m *members) alive() bool {
	if m.cgroup != "" {
		return len(m.cgroupPids()) > 0
	}
	// The leader's group (reaped by agentd itself) and the processes the
	// scans attributed: the session's own processes, without reading
	// every process on the machine (an exec of `true` beside 2,000
	// sessions would read 2,000 /proc entries).
	return groupAlive(m.leader.pid) || len(m.liveKnown()) > 0
}

// release forgets the session and removes its cgroup. Call it once no
// member is alive.
func (m *members) release() {
	if m.cgroup != "" {
		// Killed processes leave the cgroup only once reaped; an orphan
		// that agentd does not reap (no subreaper) may take a moment.
		if err := os.Remove(m.cgroup); errors.Is(err, syscall.EBUSY) {
			go m.t.removeLater(m.cgroup)
		}
		return
	}
	// Kept until the next scan has killed whatever it still attributes
	// to the session (sweepEnded), then forgotten.
	m.t.mu.Lock()
	m.ended = true
	m.t.mu.Unlock()
}

// forget drops an ended session and what was learned of it (t.mu held).
func (t *tracker) forget(m *members) {
	delete(t.sessions, m)
	for k := range m.known {
		if t.learned[k] == m {
			delete(t.learned, k)
		}
	}
}

// removeLater retries removing a session cgroup for a few seconds.
func (t *tracker) removeLater(dir string) {
	var err error
	for range 50 {
		time.Sleep(100 * time.Millisecond)
		if err = os.Remove(dir); !errors.Is(err, syscall.EBUSY) {
			break
		}
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.logger.Warn("remove session cgroup", "path", dir, "error", err)
	}
}

func (m *members) cgroupPids() []int {
	b, err := os.ReadFile(filepath.Join(m.cgroup, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for f := range strings.FieldsSeq(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
