//go:build linux

package agentd_test

import (
	"encoding/binary"
	"strings"
	"syscall"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// forgeProcExit broadcasts, from an ordinary netlink socket of this
// process, a process-events message saying pid exited: what a root shell
// in a session could send (sending to the connector's group needs only
// CAP_NET_ADMIN) to make agentd forget its shell, so that nothing it runs
// afterwards is reported.
func forgeProcExit(t *testing.T, pid int) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 11 /* NETLINK_CONNECTOR */)
	if err != nil {
		t.Fatalf("open a netlink connector socket: %v", err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	// nlmsghdr (16) + cn_msg (20) + proc_event header (16) + exit (16).
	msg := make([]byte, 16+20+16+16)
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], syscall.NLMSG_DONE)
	ne.PutUint32(msg[16:], 1)          // CN_IDX_PROC
	ne.PutUint32(msg[20:], 1)          // CN_VAL_PROC
	ne.PutUint16(msg[32:], 16+16)      // cn_msg.len
	ne.PutUint32(msg[36:], 0x80000000) // PROC_EVENT_EXIT
	ne.PutUint32(msg[52:], uint32(pid))
	ne.PutUint32(msg[56:], uint32(pid))
	if err := syscall.Sendto(fd, msg, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK, Groups: 1}); err != nil {
		t.Fatalf("broadcast the forged exit: %v", err)
	}
}

// TestExecRecordsIgnoreForgedEvents: process events that do not come from
// the kernel are ignored. A forged exit of the session's shell (sent
// before the shell runs anything more) must not switch off the records of
// what the shell runs next.
func TestExecRecordsIgnoreForgedEvents(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ctx := testCtx(t)
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "read x; /bin/sleep 0.5; /bin/echo after-forgery", Stdin: true,
		Overflow: agentd.OverflowBlock, ExecRecords: true})
	if err != nil {
		t.Fatal(err)
	}
	if resp.ExecRecords != agentd.ExecRecordsOn || resp.PID == 0 {
		t.Fatalf("create answered exec records %q, pid %d: want on and the leader's pid", resp.ExecRecords, resp.PID)
	}
	// Broadcast before the shell reads its line: the kernel queues the
	// forgery ahead of the events of the program the line starts.
	forgeProcExit(t, resp.PID)
	if err := c.WriteStdin(ctx, resp.SessionID, []byte("go\n"), true); err != nil {
		t.Fatal(err)
	}
	var recs []agentd.ExecRecord
	var out strings.Builder
	take := func(r *agentd.SessionResponse) error {
		for _, ch := range r.Chunks {
			if ch.Stream != agentd.StreamExec {
				out.Write(ch.Data)
				continue
			}
			got, err := agentd.ParseExecRecords(ch.Data)
			if err != nil {
				t.Fatalf("exec chunk %d: %v", ch.ID, err)
			}
			recs = append(recs, got...)
		}
		return nil
	}
	take(resp)
	if _, err := c.Follow(ctx, resp.SessionID, resp.NextCursor, take); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "after-forgery") {
		t.Fatalf("output %q: the command did not run its line", out.String())
	}
	// sleep, not echo: a program that exits at once can be gone before a
	// loaded machine's agentd reads its argv (then recorded, but as
	// argv_unavailable, which this test is not about).
	if _, ok := findExec(recs, "/bin/sleep", "0.5"); !ok {
		t.Fatalf("no exec record of /bin/sleep after a forged exit of the shell; records: %+v", recs)
	}
}
