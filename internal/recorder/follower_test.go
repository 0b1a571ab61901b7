package recorder_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/recorder"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// fakeSessions locates every session at one agentd, or answers final
// when its session ended.
type fakeSessions struct {
	url, token string
	mu         sync.Mutex
	final      error
}

func (s *fakeSessions) Locate(context.Context, *authz.Actor, int64) (sessions.Target, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.final != nil {
		return sessions.Target{}, s.final
	}
	return sessions.Target{AgentdURL: s.url, AgentdToken: s.token}, nil
}

func (s *fakeSessions) ReportUnreachable(context.Context, int64, error) (bool, error) {
	return false, nil
}
func (s *fakeSessions) ReportReachable(context.Context, int64) error { return nil }

// world is one org (on SQLite) with a session on a real agentd, and the
// followers of a process.
type world struct {
	t    *testing.T
	org  recorder.Org
	ad   *agentd.Client
	sess *fakeSessions
	f    *recorder.Followers
}

func newWorld(t *testing.T) *world {
	t.Helper()
	db := storetest.Open(t, store.SQLite, store.OrgSet)
	now := time.Now().UTC()
	for _, q := range []string{
		"INSERT INTO environments (name, kind, url, created_by, created_at, updated_at) VALUES ('h', 'host', 'http://h', 'x', ?, ?)",
		"INSERT INTO agents (name, description, config, sandbox_mode, default_environment_id, idle_timeout_seconds, reclaim_after_seconds, command_policy, created_by, created_at, updated_at) VALUES ('a', '', '{}', 'off', 1, 900, 3600, '[]', 'x', ?, ?)",
		"INSERT INTO sessions (agent_id, subject, created_by, sandbox_mode, state, created_at, updated_at) VALUES (1, 'user:1', 'x', 'off', 'running', ?, ?)",
	} {
		if err := db.Exec(q, now, now).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	url, token := agentdtest.Start(t)
	w := &world{t: t, ad: agentd.NewClient(url, token, nil), sess: &fakeSessions{url: url, token: token}}
	w.org = recorder.Org{Slug: "acme", DB: db, Audit: audit.NewLog(db, audit.OrgTable, nil), Sessions: w.sess}
	w.f = &recorder.Followers{
		Owner: "console-test",
		Wait:  2 * time.Second,
		OpenOrg: func(context.Context, string) (recorder.Org, func(), error) {
			return w.org, func() {}, nil
		},
		ListOrgs: func(context.Context) ([]string, error) { return []string{"acme"}, nil },
	}
	if err := w.f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.f.Stop)
	return w
}

// command records a command of the session as the gateway does, with its
// lease as given (owner "" for none).
func (w *world) command(agentdID, command, owner string, until time.Time, acked bool) recordings.Command {
	w.t.Helper()
	c := recordings.Command{SessionID: 1, AgentdID: agentdID, Command: command, ActorType: "user", ActorID: "1", ActorName: "u",
		StartedAt: time.Now().UTC(), StdinContent: true, Acked: acked}
	if owner != "" {
		c.LeaseOwner, c.LeaseUntil = owner, &until
	}
	if err := recordings.Start(context.Background(), w.org.DB, &c); err != nil {
		w.t.Fatal(err)
	}
	return c
}

// run starts command at agentd under id, as the gateway's exec does.
func (w *world) run(id, command string) *agentd.SessionResponse {
	w.t.Helper()
	resp, err := w.ad.CreateSession(context.Background(), createOf(id, command))
	if err != nil {
		w.t.Fatal(err)
	}
	return resp
}

func createOf(id, command string) agentd.CreateSessionRequest {
	return agentd.CreateSessionRequest{ID: id, Command: command, Overflow: agentd.OverflowBlock}
}

// ended waits for command id's end to be recorded and returns it with
// its recorded stdout.
func (w *world) ended(id int64) (recordings.Command, string) {
	w.t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := recordings.Get(ctx, w.org.DB, id)
		if err != nil {
			w.t.Fatal(err)
		}
		if c.Ended() {
			chunks, err := recordings.Read(ctx, w.org.DB, id, recordings.KindOut)
			if err != nil {
				w.t.Fatal(err)
			}
			var out strings.Builder
			for _, ch := range chunks {
				if ch.Stream == agentd.StreamStdout {
					out.Write(ch.Data)
				}
			}
			return c, out.String()
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("command %d still %s after 60 s", id, c.State)
		}
	}
}

// idle waits until no follower runs.
func (w *world) idle() {
	w.t.Helper()
	for deadline := time.Now().Add(60 * time.Second); w.f.Active() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			w.t.Fatalf("%d followers still running after 60 s", w.f.Active())
		}
	}
}

// TestFollowerRecordsToTheEnd: a followed command's output and end are
// recorded whether or not anyone polls, the lease released with the end.
func TestFollowerRecordsToTheEnd(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.run("rec-end", "printf 'one\\n'; sleep 0.2; printf 'two\\n'; exit 3")
	c := w.command("rec-end", "…", "", time.Time{}, true)
	w.f.Follow("acme", c.ID)
	got, out := w.ended(c.ID)
	if got.State != agentd.StateExited || got.ExitCode == nil || *got.ExitCode != 3 || out != "one\ntwo\n" {
		t.Fatalf("recorded %s (exit %v) with %q, want exited 3 with both lines", got.State, got.ExitCode, out)
	}
	w.idle()
	if got, _ := recordings.Get(context.Background(), w.org.DB, c.ID); got.LeaseOwner != "" {
		t.Fatalf("the lease is still held by %q after the end", got.LeaseOwner)
	}
}

// TestFollowerNewCommand: a command its starter follows with agentd's
// first answer is recorded from that answer on, with the starter's lease.
func TestFollowerNewCommand(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	req := createOf("rec-new", "echo first; sleep 0.3; echo second")
	req.WaitMS = 100
	first, err := w.ad.CreateSession(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	c := w.command("rec-new", "…", w.f.Owner, time.Now().Add(time.Minute), true)
	w.f.FollowNew(w.org, c, first)
	// Polls are answered from the follower's reads from the start.
	resp, st, err := w.f.ReadLive(context.Background(), "acme", w.org.DB, c.ID, 0, 0)
	if err != nil || st != recorder.LiveAnswered || resp == nil {
		t.Fatalf("a poll of a new command: %v %v %+v", st, err, resp)
	}
	if got, out := w.ended(c.ID); got.State != agentd.StateExited || out != "first\nsecond\n" {
		t.Fatalf("recorded %s with %q", got.State, out)
	}
}

// TestFollowerLeases: a command whose lease lapsed (its replica died) is
// adopted by the sweep and recorded on; one whose lease another replica
// holds is left to it.
func TestFollowerLeases(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.run("rec-lapsed", "echo adopted")
	lapsed := w.command("rec-lapsed", "…", "console-dead", time.Now().Add(-time.Minute), true)
	w.run("rec-held", "sleep 30")
	held := w.command("rec-held", "…", "console-alive", time.Now().Add(time.Hour), true)
	w.f.Sweep(context.Background())
	if got, out := w.ended(lapsed.ID); got.State != agentd.StateExited || out != "adopted\n" {
		t.Fatalf("adopted command recorded %s with %q", got.State, out)
	}
	w.f.Follow("acme", held.ID) // as a sweep would, were the lease lapsed
	w.idle()
	got, err := recordings.Get(context.Background(), w.org.DB, held.ID)
	if err != nil || got.Ended() || got.LeaseOwner != "console-alive" {
		t.Fatalf("a command another replica follows: %s, lease %q (%v)", got.State, got.LeaseOwner, err)
	}
	w.f.RenewNow(context.Background()) // nothing followed: nothing renewed
}

// TestFollowerNotStarted: a command agentd does not know is sent again
// while this process holds its create; refused, it ends lost; never
// acknowledged past the grace, it ends lost; acknowledged and forgotten
// (agentd restarted), it ends lost.
func TestFollowerNotStarted(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	for _, tc := range []struct {
		name    string
		create  *agentd.CreateSessionRequest
		acked   bool
		started time.Duration // before now
		state   string
		reason  string
		out     string
	}{
		{name: "its create is sent again", create: &agentd.CreateSessionRequest{Command: "echo late", Overflow: agentd.OverflowBlock},
			state: agentd.StateExited, out: "late\n"},
		{name: "agentd refuses it", create: &agentd.CreateSessionRequest{Command: "echo x", Overflow: "sideways"},
			state: recordings.StateLost, reason: "agentd refused to start it"},
		{name: "never acknowledged", started: 3 * time.Minute,
			state: recordings.StateLost, reason: "agentd never acknowledged starting it"},
		{name: "agentd forgot it", acked: true,
			state: recordings.StateLost, reason: "agentd no longer knows the command"},
	} {
		id := "rec-" + strings.ReplaceAll(tc.name, " ", "-")
		c := recordings.Command{SessionID: 1, AgentdID: id, Command: "…", ActorType: "user", ActorID: "1", ActorName: "u",
			StartedAt: time.Now().UTC().Add(-tc.started), Acked: tc.acked}
		if err := recordings.Start(context.Background(), w.org.DB, &c); err != nil {
			t.Fatal(err)
		}
		if tc.create != nil {
			req := *tc.create
			req.ID = id
			w.f.CreatePending(w.org, c.ID, req)
		}
		w.f.Follow("acme", c.ID)
		got, out := w.ended(c.ID)
		if got.State != tc.state || out != tc.out || !strings.HasPrefix(got.Reason, tc.reason) {
			t.Errorf("%s: recorded %s (%q) with %q; want %s (%q) with %q", tc.name, got.State, got.Reason, out, tc.state, tc.reason, tc.out)
		}
	}
	w.idle()
	if n := w.f.PendingCreates(); n != 0 {
		t.Fatalf("%d creates kept once their followers ended", n)
	}
}

// TestFollowerSessionEnded: a command whose session ended (closed, lost,
// its environment gone) is recorded lost, saying so.
func TestFollowerSessionEnded(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.sess.final = apperr.New(apperr.ErrConflict, "session_"+sessions.StateClosed, "The session is closed.")
	w.run("rec-closed", "sleep 30")
	c := w.command("rec-closed", "…", "", time.Time{}, true)
	w.f.Follow("acme", c.ID)
	if got, _ := w.ended(c.ID); got.State != recordings.StateLost || !strings.Contains(got.Reason, "its session ended") {
		t.Fatalf("recorded %s (%q), want lost as its session ended", got.State, got.Reason)
	}
}

// TestFollowerRecordsBulkOutput: output larger than one read is recorded
// whole and in order, read ahead while the batch before is stored.
func TestFollowerRecordsBulkOutput(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.run("rec-bulk", "seq 1 60000")
	c := w.command("rec-bulk", "…", "", time.Time{}, true)
	w.f.Follow("acme", c.ID)
	var want strings.Builder
	for i := 1; i <= 60000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if got, out := w.ended(c.ID); got.State != agentd.StateExited || out != want.String() {
		t.Fatalf("recorded %s with %d bytes, want %d", got.State, len(out), want.Len())
	}
	if u := w.f.LiveWindow(); u.Held != 0 {
		t.Fatalf("%d bytes kept for a command that ended", u.Held)
	}
}
