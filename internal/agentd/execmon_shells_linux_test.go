//go:build linux

package agentd_test

import (
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// TestExecRecordsShellWithOptionValue: a bash started with an option that
// takes a value (bash -o emacs), as a person could type at a prompt, is
// an interactive shell: what it runs next is marked shell_child (and so
// becomes terminal.command), as with a plain bash. Real agentd, real
// processes.
func TestExecRecordsShellWithOptionValue(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ctx := testCtx(t)
	// "; true" keeps sh from exec'ing bash in its own place: bash is then
	// a child of the leader, as a shell typed at a prompt is.
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: "bash -o emacs; true", Stdin: true,
		Overflow: agentd.OverflowBlock, ExecRecords: true})
	if err != nil {
		t.Fatal(err)
	}
	// A program that lives a moment: one that exits at once can be gone
	// before agentd reads its argv on a loaded machine (it is then
	// recorded as argv_unavailable, which this test is not about).
	if err := c.WriteStdin(ctx, resp.SessionID, []byte("/bin/sleep 0.5\n"), true); err != nil {
		t.Fatal(err)
	}
	var recs []agentd.ExecRecord
	take := func(r *agentd.SessionResponse) error {
		for _, ch := range r.Chunks {
			if ch.Stream == agentd.StreamExec {
				got, err := agentd.ParseExecRecords(ch.Data)
				if err != nil {
					t.Fatalf("exec chunk %d: %v", ch.ID, err)
				}
				recs = append(recs, got...)
			}
		}
		return nil
	}
	take(resp)
	if _, err := c.Follow(ctx, resp.SessionID, resp.NextCursor, take); err != nil {
		t.Fatal(err)
	}
	bash, ok := findExec(recs, "bash", "-o", "emacs")
	if !ok {
		t.Fatalf("no record of bash -o emacs; records: %+v", recs)
	}
	echo, ok := findExec(recs, "/bin/sleep", "0.5")
	if !ok {
		t.Fatalf("no record of the program typed into bash; records: %+v", recs)
	}
	if echo.PPID != bash.PID || !echo.ShellChild {
		t.Fatalf("record %+v of the program typed into bash -o emacs (pid %d): want its child, shell_child", echo, bash.PID)
	}
}
