//go:build linux

package agentd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
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
		// What the sessions' ends left outside their groups (found by the
		// scans that no longer run) is killed now.
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

// removeCgroupTree removes an agentd cgroup and its (empty) session
// cgroups. Populated cgroups cannot be removed; the error says so.
func removeCgroupTree(dir string) error {
	subs, _ := filepath.Glob(filepath.Join(dir, "*", "cgroup.procs"))
	for _, sub := range subs {
		os.Remove(filepath.Dir(sub))
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// removeStale removes the cgroups of agentd processes that no longer
// exist (killed before they could clean up), so they do not pile up.
// Cgroups still holding processes are left alone.
func removeStale(parent string) {
	dirs, _ := filepath.Glob(filepath.Join(parent, "agentd-*-*"))
	for _, dir := range dirs {
		pid, err := strconv.Atoi(strings.Split(filepath.Base(dir), "-")[1])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			removeCgroupTree(dir)
		}
	}
}

// setupCgroup creates the cgroup that holds the sessions' cgroups: below
// parent, or below agentd's own cgroup.
func setupCgroup(parent string, limits cgroupLimits) (string, error) {
	if parent == "" {
		own, err := ownCgroup()
		if err != nil {
			return "", err
		}
		parent = own
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(parent, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", parent, err)
	}
	if st.Type != cgroup2Magic {
		return "", fmt.Errorf("%s is not a cgroup v2 directory", parent)
	}
	removeStale(parent)
	dir := filepath.Join(parent, fmt.Sprintf("agentd-%d-%s", os.Getpid(), newSessionID()[:8]))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		os.Remove(dir)
		return "", fmt.Errorf("%s has no cgroup.kill (Linux 5.14 or later is needed): %w", dir, err)
	}
	if err := enableControllers(parent, dir, limits); err != nil {
		os.Remove(dir)
		return "", err
	}
	return dir, nil
}

const cgroup2Magic = 0x63677270

// ownCgroup finds agentd's own cgroup v2 directory.
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	var rel string
	found := false
	for line := range strings.Lines(string(b)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			rel, found = p, true
		}
	}
	if !found {
		return "", errors.New("agentd is in no cgroup v2")
	}
	mount, root, err := cgroup2Mount()
	if err != nil {
		return "", err
	}
	r, err := filepath.Rel(root, rel)
	if err != nil || strings.HasPrefix(r, "..") {
		return "", fmt.Errorf("agentd's cgroup %s is outside the mounted cgroup2 tree", rel)
	}
	return filepath.Join(mount, r), nil
}

// cgroup2Mount finds the cgroup2 mount point and the cgroup it shows.
func cgroup2Mount() (mount, root string, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		fields := strings.Fields(pre)
		if len(fields) >= 5 {
			return unescapeMount(fields[4]), unescapeMount(fields[3]), nil
		}
	}
	return "", "", errors.New("no cgroup2 file system is mounted")
}

// unescapeMount undoes mountinfo's octal escapes of spaces and the like.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// enableControllers makes the memory and pids controllers available to the
// session cgroups when limits ask for them. A cgroup with processes of its
// own cannot pass controllers down, so when agentd's own cgroup refuses,
// agentd moves itself into a leaf below dir first.
func enableControllers(parent, dir string, limits cgroupLimits) error {
	var want []string
	if limits.memoryMax > 0 {
		want = append(want, "+memory")
	}
	if limits.pidsMax > 0 {
		want = append(want, "+pids")
	}
	if len(want) == 0 {
		return nil
	}
	ctl := []byte(strings.Join(want, " "))
	err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), ctl, 0)
	if errors.Is(err, syscall.EBUSY) {
		leaf := filepath.Join(dir, "agentd")
		if err := os.Mkdir(leaf, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", leaf, err)
		}
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return fmt.Errorf("move agentd into %s: %w", leaf, err)
		}
		err = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), ctl, 0)
	}
	if err != nil {
		return fmt.Errorf("enable %s in %s (are the controllers delegated to agentd's cgroup?): %w", ctl, parent, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), ctl, 0); err != nil {
		return fmt.Errorf("enable %s in %s: %w", ctl, dir, err)
	}
	return nil
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

// procInfo is what the scan needs of one process.
type procInfo struct {
	ppid, pgrp, sid int
	start           uint64
	zombie          bool
}

// scanLoop keeps learning the fallback sessions' processes, so one that
// later leaves the tree (setsid, then its parent exits) stays attributed.
func (t *tracker) scanLoop() {
	defer t.wg.Done()
	wait := time.NewTimer(scanEvery)
	defer wait.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-wait.C:
			t.mu.Lock()
			busy := len(t.sessions) > 0
			t.mu.Unlock()
			next := scanEvery
			if busy {
				start := time.Now()
				t.scanAndSweep()
				// A scan reads every process on the machine: beside
				// thousands it takes tens of milliseconds, and scans
				// back to back would take a core from the commands.
				// Spaced to use at most 1/scanShare of a core.
				next = max(scanEvery, scanShare*time.Since(start))
			}
			wait.Reset(next)
		}
	}
}

// scanShare spaces scans so that they take at most one part in scanShare
// of a core (a scan every 100 ms up to 5 ms a scan).
const scanShare = 20

// scanAndSweep runs one scan and kills what ended sessions left.
func (t *tracker) scanAndSweep() {
	t.scanMu.Lock()
	defer t.scanMu.Unlock()
	t.sweepEnded(t.scan())
}

// rescan returns once a scan that started after the call has finished:
// its own, or one another caller started meanwhile.
func (t *tracker) rescan() {
	t.mu.Lock()
	asked := t.scanStarts
	t.mu.Unlock()
	t.scanMu.Lock()
	defer t.scanMu.Unlock()
	t.mu.Lock()
	done := t.scanDone
	t.mu.Unlock()
	if done > asked {
		return
	}
	t.sweepEnded(t.scan())
}

// scan (scanMu held) reads /proc and attributes every process to a fallback session,
// learning them for later scans (so one that later leaves the tree stays
// attributed), and returns the live processes of ended sessions with, when
// agentd is a child subreaper and a session ended, the orphans it adopted
// that no session claims (they escaped some session between two scans).
func (t *tracker) scan() map[*members][]int {
	t.mu.Lock()
	t.scanStarts++
	n := t.scanStarts
	t.mu.Unlock()
	procs := readProcs()
	t.mu.Lock()
	defer t.mu.Unlock()
	defer func() { t.scanDone = n }()
	leaders := make(map[int]*members, len(t.sessions))
	anyEnded := false
	for s := range t.sessions {
		if s.ended {
			anyEnded = true
			// An ended session's leader is reaped: a process with its pid
			// now is another one, and Linux does not reuse a pid while a
			// group or session of that id exists, so none of the ended
			// session's remains.
			if _, reused := procs[s.leader.pid]; reused || leaders[s.leader.pid] != nil {
				continue
			}
		}
		leaders[s.leader.pid] = s
	}
	owners := make(map[int]*members, len(procs))
	// orphans stands for the trees of orphans agentd adopted that no
	// session claims.
	orphans := &members{}
	var owner func(pid int, depth int) *members
	owner = func(pid int, depth int) *members {
		if o, ok := owners[pid]; ok {
			return o
		}
		info, ok := procs[pid]
		if !ok || pid == t.self || pid == t.spawn.pid() || depth > 64 {
			return nil
		}
		o := t.learned[procKey{pid, info.start}]
		if o == nil {
			o = leaders[info.sid]
		}
		if o == nil {
			o = leaders[info.pgrp]
		}
		if o == nil && info.ppid > 1 && info.ppid != t.self && info.ppid != t.spawn.pid() {
			o = owner(info.ppid, depth+1)
		}
		if o == nil && t.subreaper && info.ppid == t.self && leaders[pid] == nil {
			o = orphans // with its descendants
		}
		owners[pid] = o
		return o
	}
	out := make(map[*members][]int)
	for pid, info := range procs {
		o := owner(pid, 0)
		if o != nil && o != orphans {
			k := procKey{pid, info.start}
			if prev := t.learned[k]; prev != o {
				if prev != nil {
					delete(prev.known, k)
				}
				t.learned[k] = o
				o.known[k] = struct{}{}
			}
		}
		if info.zombie || o == nil || (o == orphans && !anyEnded) || (o != orphans && !o.ended) {
			continue
		}
		out[o] = append(out[o], pid)
	}
	for k, o := range t.learned {
		if info, ok := procs[k.pid]; !ok || info.start != k.start {
			delete(t.learned, k)
			delete(o.known, k)
		}
	}
	return out
}

// sweepScans bounds how many scans look for an ended session's leftovers
// (ones SIGKILL does not end at once: uninterruptible sleep).
const sweepScans = 50

// sweepEnded kills the live processes scan found of ended sessions (and
// the unclaimed orphans, keyed by a members of its own), and forgets the
// ended sessions that had none left, or have been swept sweepScans times.
func (t *tracker) sweepEnded(left map[*members][]int) {
	for _, pids := range left {
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for m := range t.sessions {
		if !m.ended {
			continue
		}
		if m.sweeps++; len(left[m]) == 0 || m.sweeps >= sweepScans {
			t.forget(m)
		}
	}
}

// readProcs reads every process's parent, group, session and start time.
func readProcs() map[int]procInfo {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	procs := make(map[int]procInfo, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if info, ok := readProc(pid); ok {
			procs[pid] = info
		}
	}
	return procs
}

func readProc(pid int) (procInfo, bool) {
	// Read with plain syscalls into a buffer on the stack: a scan reads
	// one of these per process on the machine (os.ReadFile adds a stat
	// and an allocation to each).
	var buf [1024]byte
	fd, err := syscall.Open("/proc/"+strconv.Itoa(pid)+"/stat", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return procInfo{}, false
	}
	n, err := syscall.Read(fd, buf[:])
	syscall.Close(fd)
	if err != nil || n <= 0 {
		return procInfo{}, false
	}
	b := buf[:n]
	// The command name may hold spaces and parentheses; the fields start
	// after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procInfo{}, false
	}
	var info procInfo
	field := 0
	for rest := b[i+1:]; len(rest) > 0 && field <= 19; {
		rest = bytes.TrimLeft(rest, " ")
		end := bytes.IndexByte(rest, ' ')
		if end < 0 {
			end = len(rest)
		}
		f := rest[:end]
		rest = rest[end:]
		switch field {
		case 0:
			info.zombie = len(f) > 0 && (f[0] == 'Z' || f[0] == 'X')
		case 1:
			info.ppid = atoi(f)
		case 2:
			info.pgrp = atoi(f)
		case 3:
			info.sid = atoi(f)
		case 19:
			info.start = uint64(atoi(f))
		}
		field++
	}
	return info, field > 19
}

// atoi reads a non-negative decimal number (0 when there is none).
func atoi(b []byte) int {
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// procStart is pid's start time (0 if unknown).
func procStart(pid int) uint64 {
	info, _ := readProc(pid)
	return info.start
}

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
