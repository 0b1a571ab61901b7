package agentd

import "testing"

// TestExecMonitorPIDReusedByNewLeader: when the exit of a session's
// process was lost (the kernel's queue overflowed) and agentd's next
// session leader gets its pid, the new leader's programs are the new
// session's, never reported into the old one's recording.
func TestExecMonitorPIDReusedByNewLeader(t *testing.T) {
	m, _ := testMonitor()
	var a, b []ExecRecord
	m.starting.Add(1)
	m.handleMessages(procMsg(procEventFork, 1, 1, 10, 10))
	m.claim(10, true, func(r ExecRecord) { a = append(a, r) })
	m.handleMessages(append(procMsg(procEventFork, 10, 10, 11, 11), procMsg(procEventExec, 11, 11)...))
	// 11's exit event is lost; agentd (pid 1) forks its next leader, which
	// the kernel gives pid 11, and that leader execs before it is claimed.
	m.handleMessages(append(procMsg(procEventFork, 1, 1, 11, 11), procMsg(procEventExec, 11, 11)...))
	m.claim(11, true, func(r ExecRecord) { b = append(b, r) })
	if len(a) != 1 || a[0].PID != 11 || a[0].Depth != 1 {
		t.Fatalf("session A got %+v: want only its own child's exec", a)
	}
	if len(b) != 1 || b[0].PID != 11 || b[0].Depth != 0 {
		t.Fatalf("session B got %+v: want its leader's exec at depth 0", b)
	}
}
