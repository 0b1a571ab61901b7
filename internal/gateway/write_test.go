package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// oneSession is the sessions domain as a file write sees it: one running
// session at the test's agentd. The real service would need a sandbox
// backend or a host workspace; what is under test here is the gateway.
type oneSession struct{ t sessions.Target }

func (s oneSession) EnsureFor(_ context.Context, _ *authz.Actor, _ int64, check func(sessions.Target) error) (sessions.Target, error) {
	return s.t, check(s.t)
}
func (s oneSession) Locate(context.Context, *authz.Actor, int64) (sessions.Target, error) {
	return s.t, nil
}
func (s oneSession) LocateForClose(context.Context, *authz.Actor, int64) (sessions.Target, error) {
	return s.t, nil
}
func (oneSession) ReportUnreachable(context.Context, int64, error) (bool, error) { return false, nil }
func (oneSession) ReportReachable(context.Context, int64) error                  { return nil }

// TestWriteSlots: the bytes a replica spools at once are bounded. With one
// slot, a write arriving while another spools is refused as busy (503
// with a retry hint, nothing read, audited or forwarded) once its short
// wait is over, and goes through once the slot is free; a caller that
// hangs up stops waiting at once; and every way a write ends (written,
// too large, cut short, refused by agentd) gives its slot back.
func TestWriteSlots(t *testing.T) {
	const token = "test-token-0123456789abcdef"
	root := t.TempDir()
	srv, err := agentd.NewServer(agentd.Config{Token: token, Root: root})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	db := storetest.Open(t, store.SQLite, store.OrgSet)
	log := audit.NewLog(db, audit.OrgTable, nil)
	target := sessions.Target{Session: sessions.Session{ID: 1}, AgentdURL: ts.URL, AgentdToken: token}
	org := Org{Slug: "acme", DB: db, Audit: log, Sessions: oneSession{target}}
	wrongKey := target
	wrongKey.AgentdToken = "not-the-token-0123456789abcdef"
	refusing := Org{Slug: "acme", DB: db, Audit: log, Sessions: oneSession{wrongKey}}

	g := &Gateway{HTTP: ts.Client(), WriteSlots: 1, WriteSlotWait: 20 * time.Millisecond}
	ctx := context.Background()
	write := func(ctx context.Context, org Org, path string, body io.Reader) error {
		_, err := g.WriteFile(ctx, org, authz.System("test"), Meta{}, 1, WriteRequest{Path: path, Body: body})
		return err
	}
	isBusy := func(err error) bool {
		var ae *apperr.Error
		return errors.As(err, &ae) && ae.Code == "replica_busy" && errors.Is(err, apperr.ErrUnavailable) && ae.RetryAfter > 0
	}
	audited := func(path string) int64 {
		var n int64
		if err := db.Table(audit.OrgTable).Where("action = ? AND details LIKE ?", "file.write", "%"+path+"%").Count(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("a second write waits for the first's slot", func(t *testing.T) {
		pr, pw := io.Pipe()
		first := make(chan error, 1)
		go func() { first <- write(ctx, org, "first.txt", pr) }()
		// Once the spool has read this, the first write holds the slot.
		if _, err := pw.Write([]byte("first")); err != nil {
			t.Fatal(err)
		}
		second := &countingReader{r: strings.NewReader("second")}
		if err := write(ctx, org, "second.txt", second); !isBusy(err) {
			t.Fatalf("a write while the only slot is taken = %v, want replica_busy", err)
		}
		if second.n != 0 || audited("second.txt") != 0 {
			t.Fatalf("the refused write: %d bytes read, %d audit records; want none", second.n, audited("second.txt"))
		}
		pw.Close()
		if err := <-first; err != nil {
			t.Fatalf("the first write: %v", err)
		}
		if err := write(ctx, org, "second.txt", strings.NewReader("second")); err != nil {
			t.Fatalf("the second write, sent again once the slot is free: %v", err)
		}
		if got, err := readFile(root, "second.txt"); got != "second" || err != nil {
			t.Fatalf("second.txt holds %q (%v)", got, err)
		}
	})

	t.Run("a caller that hangs up stops waiting", func(t *testing.T) {
		patient := &Gateway{HTTP: ts.Client(), WriteSlots: 1, WriteSlotWait: time.Hour}
		release, err := patient.writeSlot(ctx, "another-org")
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		gone, cancel := context.WithCancel(ctx)
		cancel()
		_, err = patient.WriteFile(gone, org, authz.System("test"), Meta{}, 1, WriteRequest{Path: "gone.txt", Body: strings.NewReader("x")})
		if !errors.Is(err, context.Canceled) || isBusy(err) {
			t.Fatalf("a write whose caller left while waiting = %v, want context.Canceled", err)
		}
	})

	t.Run("every ending gives the slot back", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			org  Org
			body io.Reader
			code string // "": written
		}{
			{"written", org, strings.NewReader("ok"), ""},
			{"too large", org, io.LimitReader(zeros{}, MaxWriteBytes+1), "body_too_large"},
			{"cut short", org, failingReader{strings.NewReader("half")}, "body_incomplete"},
			{"refused by agentd", refusing, strings.NewReader("ok"), "unauthorized"},
		} {
			err := write(ctx, tc.org, "ending.txt", tc.body)
			var ae *apperr.Error
			switch {
			case tc.code == "" && err != nil:
				t.Fatalf("%s: %v", tc.name, err)
			case tc.code != "" && (!errors.As(err, &ae) || ae.Code != tc.code):
				t.Fatalf("%s: err = %v, want %s", tc.name, err, tc.code)
			}
			if err := write(ctx, org, "after.txt", strings.NewReader("after")); err != nil {
				t.Fatalf("a write after one %s: %v (the slot was kept)", tc.name, err)
			}
		}
	})

	t.Run("one org holds at most half the slots", func(t *testing.T) {
		shared := &Gateway{HTTP: ts.Client(), WriteSlots: 4, WriteSlotWait: time.Hour}
		var held []func()
		for range 2 {
			release, err := shared.writeSlot(ctx, "acme")
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, release)
		}
		// Refused at once, though slots are free and the wait is long.
		if _, err := shared.writeSlot(ctx, "acme"); !isBusy(err) || !strings.Contains(err.Error(), "of this organization") {
			t.Fatalf("acme's third write = %v, want replica_busy naming the organization's share", err)
		}
		other, err := shared.writeSlot(ctx, "globex")
		if err != nil {
			t.Fatalf("another org's write while acme holds its half: %v", err)
		}
		other()
		held[0]()
		release, err := shared.writeSlot(ctx, "acme")
		if err != nil {
			t.Fatalf("acme's write after one of its own ended: %v", err)
		}
		release()
		held[1]()
	})

	t.Run("a body that stalls ends the write and frees the slot", func(t *testing.T) {
		var deadlines []time.Time
		set := func(d time.Time) error { deadlines = append(deadlines, d); return nil }
		// What a connection whose read deadline passed answers.
		stalled := io.MultiReader(strings.NewReader("some"), errReader{fmt.Errorf("read tcp: %w", os.ErrDeadlineExceeded)})
		_, err := g.WriteFile(ctx, org, authz.System("test"), Meta{}, 1, WriteRequest{Path: "stalled.txt", Body: stalled, ReadDeadline: set})
		var ae *apperr.Error
		if !errors.As(err, &ae) || ae.Code != "body_stalled" || audited("stalled.txt") != 0 {
			t.Fatalf("a stalled body = %v (%d audited), want body_stalled and nothing audited", err, audited("stalled.txt"))
		}
		if len(deadlines) < 2 || deadlines[0].IsZero() || !deadlines[len(deadlines)-1].IsZero() {
			t.Fatalf("read deadlines set %v: want one ahead before the reads and the zero time (none) after", deadlines)
		}
		if err := write(ctx, org, "after-stall.txt", strings.NewReader("after")); err != nil {
			t.Fatalf("a write after a stalled one: %v (the slot was kept)", err)
		}
	})
}

// errReader fails every read with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func readFile(root, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, name))
	return string(b), err
}
