//go:build linux

package agentd_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

// runWithRecords runs command in a session that asks for exec records and
// returns the records and the rest of the output.
func runWithRecords(t *testing.T, c *agentd.Client, req agentd.CreateSessionRequest) (recs []agentd.ExecRecord, other string, answer string) {
	t.Helper()
	ctx := testCtx(t)
	resp, err := c.CreateSession(ctx, req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	answer = resp.ExecRecords
	collect := func(r *agentd.SessionResponse) error {
		for _, ch := range r.Chunks {
			if ch.Stream != agentd.StreamExec {
				other += string(ch.Data)
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
	collect(resp)
	if _, err := c.Follow(ctx, resp.SessionID, resp.NextCursor, collect); err != nil {
		t.Fatalf("follow: %v", err)
	}
	return recs, other, answer
}

func findExec(recs []agentd.ExecRecord, argv ...string) (agentd.ExecRecord, bool) {
	for _, r := range recs {
		if r.Type == agentd.ExecRecordExec && slices.Equal(r.Argv, argv) {
			return r, true
		}
	}
	return agentd.ExecRecord{}, false
}

// TestExecRecords: a session that asks gets a record of every program it
// started, from the kernel: argv, cwd, pid and parent, depth below the
// shell, whether it was the process's first program, and the exit codes of
// the shell's direct children; none of a burst of short processes is lost.
// The processes whose argv is checked wait on stdin until their record was
// seen, so the test does not depend on winning a race with their exit.
func TestExecRecords(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ctx := testCtx(t)
	const burst = 300
	cmd := `cd /tmp && /bin/sh -c 'read x; exit 7' a-marker; bash -c 'read y; /bin/true; exit 0'; ` +
		`i=0; while [ $i -lt ` + strconv.Itoa(burst) + ` ]; do /bin/true; i=$((i+1)); done; echo done`
	resp, err := c.CreateSession(ctx, agentd.CreateSessionRequest{Command: cmd, Stdin: true, Overflow: agentd.OverflowBlock, ExecRecords: true})
	if err != nil {
		t.Fatal(err)
	}
	if resp.ExecRecords != agentd.ExecRecordsOn {
		t.Fatalf("create answered %s %q, want %q", agentd.HeaderExecRecords, resp.ExecRecords, agentd.ExecRecordsOn)
	}
	var recs []agentd.ExecRecord
	var out strings.Builder
	cursor := uint64(0)
	take := func(r *agentd.SessionResponse) {
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
		cursor = r.NextCursor
	}
	take(resp)
	// awaitExec polls until a record of argv is there.
	awaitExec := func(argv ...string) agentd.ExecRecord {
		t.Helper()
		for {
			if r, ok := findExec(recs, argv...); ok {
				return r
			}
			r, err := c.Poll(ctx, resp.SessionID, cursor, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if r.State != agentd.StateRunning && len(r.Chunks) == 0 {
				t.Fatalf("session ended without a record of %q; records: %+v", argv, recs)
			}
			take(r)
		}
	}
	sh := awaitExec("/bin/sh", "-c", "read x; exit 7", "a-marker")
	if err := c.WriteStdin(ctx, resp.SessionID, []byte("1\n"), false); err != nil {
		t.Fatal(err)
	}
	bash := awaitExec("bash", "-c", "read y; /bin/true; exit 0")
	if err := c.WriteStdin(ctx, resp.SessionID, []byte("2\n"), true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Follow(ctx, resp.SessionID, cursor, func(r *agentd.SessionResponse) error { take(r); return nil }); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "done") {
		t.Fatalf("output %q lacks the command's own output", out.String())
	}
	t.Run("direct child", func(t *testing.T) {
		if sh.Depth != 1 || !sh.First || sh.Cwd != "/tmp" || sh.PID == 0 || sh.PPID == 0 || sh.UID == nil || sh.ArgvUnavailable {
			t.Fatalf("record %+v: want depth 1, first, cwd /tmp, pids and uid", sh)
		}
	})
	t.Run("nested", func(t *testing.T) {
		if bash.Depth != 1 || !bash.First {
			t.Fatalf("bash -c record %+v: want depth 1, first", bash)
		}
		for _, r := range recs {
			if r.Type == agentd.ExecRecordExec && r.Depth == 2 && r.PPID == bash.PID {
				return
			}
		}
		t.Fatalf("no depth-2 record below bash %d", bash.PID)
	})
	t.Run("exit codes", func(t *testing.T) {
		for _, r := range recs {
			if r.Type == agentd.ExecRecordExit && r.PID == sh.PID {
				if r.ExitCode == nil || *r.ExitCode != 7 {
					t.Fatalf("exit record %+v: want exit code 7", r)
				}
				return
			}
		}
		t.Fatal("no exit record of sh -c 'read x; exit 7'")
	})
	t.Run("burst counted", func(t *testing.T) {
		n := 0
		for _, r := range recs {
			if r.Type == agentd.ExecRecordExec && r.Depth == 1 && (slices.Equal(r.Argv, []string{"/bin/true"}) || r.ArgvUnavailable) {
				n++
			}
			if r.Type == agentd.ExecRecordLost {
				t.Fatalf("records were lost: %+v", r)
			}
		}
		if n != burst {
			t.Fatalf("%d records of the burst's /bin/true, want %d", n, burst)
		}
	})
}

// TestExecRecordsNotAsked: a session whose create did not ask (an older
// console) never sees the exec stream.
func TestExecRecordsNotAsked(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	recs, out, answer := runWithRecords(t, c, agentd.CreateSessionRequest{Command: "/bin/echo quiet-marker"})
	if len(recs) != 0 || answer != "" {
		t.Fatalf("got %d exec records and answer %q without asking", len(recs), answer)
	}
	if !strings.Contains(out, "quiet-marker") {
		t.Fatalf("output %q", out)
	}
}

// TestExecReportingOff: turned off, health says so and a session that asks
// is answered "unavailable" and runs without records.
func TestExecReportingOff(t *testing.T) {
	t.Parallel()
	c := newClient(t, agentdtest.WithConfig(func(cfg *agentd.Config) { cfg.ExecReporting = agentd.ExecReportingDisabled }))
	h, err := c.Health(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if h.ExecReporting != agentd.ExecReportingOff || h.ExecReportingReason == "" {
		t.Fatalf("health %+v: want exec_reporting off with a reason", h)
	}
	recs, _, answer := runWithRecords(t, c, agentd.CreateSessionRequest{Command: "/bin/true", ExecRecords: true})
	if answer != agentd.ExecRecordsUnavailable || len(recs) != 0 {
		t.Fatalf("answer %q with %d records, want unavailable and none", answer, len(recs))
	}
	on := newClient(t)
	if h, err := on.Health(testCtx(t)); err != nil || h.ExecReporting != agentd.ExecReportingNetlink {
		t.Fatalf("default health %+v (%v): want netlink (agentd runs as root here)", h, err)
	}
}
