//go:build linux

package agentd

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

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
