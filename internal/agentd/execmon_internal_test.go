package agentd

import (
	"encoding/binary"
	"log/slog"
	"testing"
)

// procMsg builds one netlink message of the process-events connector.
func procMsg(what uint32, fields ...uint32) []byte {
	b := make([]byte, nlmsgHdrLen+cnMsgHdrLen+procEventHdrLen+4*len(fields))
	binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
	binary.NativeEndian.PutUint32(b[nlmsgHdrLen:], cnIdxProc)
	binary.NativeEndian.PutUint32(b[nlmsgHdrLen+4:], cnValProc)
	ev := b[nlmsgHdrLen+cnMsgHdrLen:]
	binary.NativeEndian.PutUint32(ev[0:], what)
	for i, f := range fields {
		binary.NativeEndian.PutUint32(ev[procEventHdrLen+4*i:], f)
	}
	return b
}

func testMonitor() (*execMonitor, *[]ExecRecord) {
	m := newExecMonitor(1, slog.New(slog.DiscardHandler))
	m.inspect = func(pid int) ([]string, string, *uint32, bool) {
		if pid == 99 { // gone before it could be read
			return []string{"short"}, "", nil, false
		}
		return []string{"prog", "arg"}, "/w", nil, true
	}
	var got []ExecRecord
	return m, &got
}

// TestExecMonitorAttribution: processes are attributed to the session of
// the leader they descend from, by fork events alone, whether the claim
// comes before or after the leader's fork event; threads and strangers
// cost nothing; only the leader's direct children report exits.
func TestExecMonitorAttribution(t *testing.T) {
	m, got := testMonitor()
	sink := func(r ExecRecord) { *got = append(*got, r) }
	m.starting.Add(1) // a session is being started
	// Leader 10 forked by agentd (pid 1), its exec seen before the claim.
	m.handleMessages(procMsg(procEventFork, 1, 1, 10, 10))
	m.handleMessages(procMsg(procEventExec, 10, 10))
	o := m.claim(10, true, sink)
	batch := append(procMsg(procEventFork, 10, 10, 11, 11), procMsg(procEventExec, 11, 11)...) // child
	batch = append(batch, procMsg(procEventFork, 11, 11, 12, 12)...)                           // grandchild
	batch = append(batch, procMsg(procEventExec, 12, 12)...)
	batch = append(batch, procMsg(procEventExec, 12, 12)...)           // exec again in place
	batch = append(batch, procMsg(procEventFork, 11, 11, 13, 14)...)   // a thread
	batch = append(batch, procMsg(procEventFork, 50, 50, 51, 51)...)   // a stranger
	batch = append(batch, procMsg(procEventExec, 51, 51)...)           // its exec
	batch = append(batch, procMsg(procEventFork, 10, 10, 99, 99)...)   // a child that is gone at once
	batch = append(batch, procMsg(procEventExec, 99, 99)...)           //
	batch = append(batch, procMsg(procEventExit, 12, 12, 0, 17)...)    // grandchild exits: no exit record
	batch = append(batch, procMsg(procEventExit, 11, 11, 3<<8, 17)...) // child exits 3
	batch = append(batch, procMsg(procEventExit, 99, 99, 9, 17)...)    // killed by signal 9
	batch = append(batch, procMsg(procEventExit, 10, 10, 0, 17)...)    // leader
	m.handleMessages(batch)
	select {
	case <-o.exited:
	default:
		t.Fatal("the leader's exit did not close exited")
	}
	type want struct {
		typ         string
		pid, depth  int
		first       bool
		code        int
		unavailable bool
	}
	wants := []want{
		{ExecRecordExec, 10, 0, true, -1, false},
		{ExecRecordExec, 11, 1, true, -1, false},
		{ExecRecordExec, 12, 2, true, -1, false},
		{ExecRecordExec, 12, 2, false, -1, false},
		{ExecRecordExec, 99, 1, true, -1, true},
		{ExecRecordExit, 11, 1, false, 3, false},
		{ExecRecordExit, 99, 1, false, 137, false},
	}
	if len(*got) != len(wants) {
		t.Fatalf("got %d records %+v, want %d", len(*got), *got, len(wants))
	}
	for i, w := range wants {
		r := (*got)[i]
		code := -1
		if r.ExitCode != nil {
			code = *r.ExitCode
		}
		if r.Type != w.typ || r.PID != w.pid || r.Depth != w.depth || r.First != w.first || code != w.code || r.ArgvUnavailable != w.unavailable {
			t.Errorf("record %d = %+v, want %+v", i, r, w)
		}
	}
	if r := (*got)[4]; r.Comm != "short" || len(r.Argv) != 0 {
		t.Errorf("gone process record %+v: want comm kept, no argv", r)
	}
	m.release(o)
	if len(m.procs) != 0 {
		t.Fatalf("%d processes still tracked after every exit: %+v", len(m.procs), m.procs)
	}
}

// TestExecMonitorNotWanted: a session that did not ask is tracked without
// reading anything for it.
func TestExecMonitorNotWanted(t *testing.T) {
	m, _ := testMonitor()
	read := 0
	m.inspect = func(int) ([]string, string, *uint32, bool) { read++; return nil, "", nil, false }
	m.claim(20, false, nil)
	m.handleMessages(append(procMsg(procEventFork, 20, 20, 21, 21), procMsg(procEventExec, 21, 21)...))
	if read != 0 {
		t.Fatalf("read /proc %d times for a session that did not ask", read)
	}
}

func TestBoundArgv(t *testing.T) {
	long := make([]byte, MaxExecArgv)
	for i := range long {
		long[i] = 'a'
	}
	tests := []struct {
		name      string
		argv      []string
		wantN     int
		wantTotal int
		cut       bool
	}{
		{"short", []string{"ls", "-l"}, 2, 6, false},
		{"exactly", []string{string(long[:MaxExecArgv-1])}, 1, MaxExecArgv, false},
		{"one long", []string{"x", string(long)}, 2, MaxExecArgv - 1, true},
		{"many", []string{string(long[:MaxExecArgv-2]), "b", "c"}, 1, MaxExecArgv - 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, cut := boundArgv(tt.argv)
			total := 0
			for _, a := range got {
				total += len(a) + 1
			}
			if len(got) != tt.wantN || cut != tt.cut || total > MaxExecArgv || (!cut && total != tt.wantTotal) {
				t.Fatalf("boundArgv: %d args, %d bytes, cut %v; want %d args, cut %v, at most %d bytes", len(got), total, cut, tt.wantN, tt.cut, MaxExecArgv)
			}
		})
	}
}

// FuzzProcEvents feeds arbitrary datagrams to the process-events decoder:
// it must never panic or read outside the buffer, whatever lengths the
// messages claim.
func FuzzProcEvents(f *testing.F) {
	f.Add(procMsg(procEventFork, 1, 1, 10, 10))
	f.Add(append(procMsg(procEventExec, 10, 10), procMsg(procEventExit, 10, 10, 0, 17)...))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, _ := testMonitor()
		m.starting.Add(1)
		m.claim(10, true, func(ExecRecord) {})
		m.handleMessages(procMsg(procEventFork, 1, 1, 10, 10))
		m.handleMessages(b)
	})
}

// FuzzExecRecords: the exec-stream decoder the console uses never panics,
// and what it decodes encodes back to records it decodes the same.
func FuzzExecRecords(f *testing.F) {
	f.Add([]byte(`{"type":"exec","time":"2026-01-01T00:00:00Z","pid":3,"ppid":2,"depth":1,"first":true,"argv":["ls","-l"]}` + "\n"))
	f.Add([]byte("{\"type\":\"exit\",\"exit_code\":3}\n\n{"))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, _ := ParseExecRecords(b)
		var again []byte
		for _, r := range recs {
			again = appendExecRecord(again, r)
			_ = ExecLine(r)
		}
		back, err := ParseExecRecords(again)
		if err != nil || len(back) != len(recs) {
			t.Fatalf("re-encoded records do not decode: %v (%d vs %d)", err, len(back), len(recs))
		}
	})
}

func TestInteractiveShell(t *testing.T) {
	tests := []struct {
		argv []string
		want bool
	}{
		{[]string{"bash"}, true},
		{[]string{"/bin/bash", "-l"}, true},
		{[]string{"-zsh"}, true},
		{[]string{"bash", "--norc", "--noprofile", "-i"}, true},
		{[]string{"bash", "-c", "ls"}, false},
		{[]string{"bash", "-lc", "ls"}, false},
		{[]string{"sh", "build.sh"}, false},
		{[]string{"bash", "--rcfile", "/dev/fd/63", "-i"}, true}, // the terminal's own bash (the leader: its children count anyway)
		{[]string{"python3"}, false},
	}
	for _, tt := range tests {
		if got := interactiveShell(tt.argv); got != tt.want {
			t.Errorf("interactiveShell(%q) = %v, want %v", tt.argv, got, tt.want)
		}
	}
}

// TestExecMonitorShellChildren: the children of the leader, and of an
// interactive shell below it, are shell children; those of bash -c are not.
func TestExecMonitorShellChildren(t *testing.T) {
	m, got := testMonitor()
	argv := map[int][]string{20: {"sh", "-c", "bash -i"}, 21: {"bash", "-i"}, 22: {"/bin/ls"}, 23: {"bash", "-c", "x"}, 24: {"x"}}
	m.inspect = func(pid int) ([]string, string, *uint32, bool) { return argv[pid], "/", nil, true }
	m.starting.Add(1)
	m.claim(20, true, func(r ExecRecord) { *got = append(*got, r) })
	for _, ev := range [][]byte{
		procMsg(procEventExec, 20, 20),
		procMsg(procEventFork, 20, 20, 21, 21), procMsg(procEventExec, 21, 21), // bash -i, forked by sh -c
		procMsg(procEventFork, 21, 21, 22, 22), procMsg(procEventExec, 22, 22), // typed into it
		procMsg(procEventFork, 21, 21, 23, 23), procMsg(procEventExec, 23, 23), // bash -c typed into it
		procMsg(procEventFork, 23, 23, 24, 24), procMsg(procEventExec, 24, 24), // run by bash -c
	} {
		m.handleMessages(ev)
	}
	want := map[int]bool{20: false, 21: true, 22: true, 23: true, 24: false}
	for _, r := range *got {
		if r.ShellChild != want[r.PID] {
			t.Errorf("pid %d (%q): shell_child %v, want %v", r.PID, r.Argv, r.ShellChild, want[r.PID])
		}
	}
	if len(*got) != len(want) {
		t.Fatalf("%d records, want %d", len(*got), len(want))
	}
}

// TestExecMonitorLeaderGoneBeforeClaim: a command as fast as `true` can
// fork, exec and exit before agentd's claim of it. The claim must still
// get the leader's exec record and find the exit already seen, or the
// session's end waits execRecordsGrace for an exit that was read before.
func TestExecMonitorLeaderGoneBeforeClaim(t *testing.T) {
	cases := []struct {
		name     string
		starting bool // a start is in progress (as it is for every claim)
		reused   bool // agentd forked another child under the pid before the claim
		wantExit bool
		wantRecs int
	}{
		{"exit read before the claim", true, false, true, 1},
		{"pid given to a new child before the claim", true, true, false, 0},
		{"no start in progress", false, false, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, got := testMonitor()
			sink := func(r ExecRecord) { *got = append(*got, r) }
			if tc.starting {
				m.starting.Add(1)
			}
			batch := append(procMsg(procEventFork, 1, 1, 10, 10), procMsg(procEventExec, 10, 10)...)
			batch = append(batch, procMsg(procEventExit, 10, 10, 0, 17)...)
			if tc.reused {
				batch = append(batch, procMsg(procEventFork, 1, 1, 10, 10)...)
			}
			m.handleMessages(batch)
			o := m.claim(10, true, sink)
			exited := false
			select {
			case <-o.exited:
				exited = true
			default:
			}
			if exited != tc.wantExit {
				t.Fatalf("exited seen at the claim = %v, want %v", exited, tc.wantExit)
			}
			if len(*got) != tc.wantRecs {
				t.Fatalf("records = %+v, want %d", *got, tc.wantRecs)
			}
			if tc.wantRecs > 0 && ((*got)[0].Type != ExecRecordExec || (*got)[0].PID != 10 || !(*got)[0].First) {
				t.Fatalf("record = %+v, want the leader's first exec", (*got)[0])
			}
			if len(m.early) != 0 {
				t.Fatalf("early keeps %d owners after the claim", len(m.early))
			}
			m.release(o)
		})
	}
}

// TestExecMonitorEarlyExitsBounded: children of agentd that exit and are
// never claimed (another server's, in one process) do not pile up.
func TestExecMonitorEarlyExitsBounded(t *testing.T) {
	m, _ := testMonitor()
	m.starting.Add(1)
	for pid := uint32(100); pid < 100+3*maxEarlyExits; pid++ {
		m.handleMessages(append(procMsg(procEventFork, 1, 1, pid, pid), procMsg(procEventExit, pid, pid, 0, 17)...))
	}
	if len(m.early) != maxEarlyExits {
		t.Fatalf("early holds %d owners, want the cap %d", len(m.early), maxEarlyExits)
	}
}
