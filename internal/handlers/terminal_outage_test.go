package handlers_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/netfault"
	"github.com/gatehouse/gatehouse/internal/store"
)

// dbCutter is a loopback TCP forwarder in front of Postgres (or agentd)
// that a test can cut (every live connection closed, new ones closed as
// soon as they are accepted) and restore, to stop "the database" for one
// console without stopping the server others use.
type dbCutter = netfault.Forwarder

// cutDatabase reroutes cfg's DATABASE_URL through a dbCutter and returns
// it; the catalog and the org databases (on the same server) all go
// through it.
func cutDatabase(t *testing.T, cfg *config.Config) *dbCutter {
	t.Helper()
	c, dsn := newDBCutter(t, cfg.DatabaseURL)
	cfg.DatabaseURL = dsn
	return c
}

// newDBCutter puts a dbCutter in front of the server of dsn and returns it
// with dsn rerouted through it.
func newDBCutter(t *testing.T, dsn string) (*dbCutter, string) {
	t.Helper()
	c, rerouted, err := netfault.Reroute(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, rerouted
}

// TestTerminalDatabaseOutage cuts Postgres in the middle of a session (a
// command running and followed): every terminal operation answers 503 and
// agentd hears of none of them; once the database is back the same console
// runs commands again, and the recording of the command that ran across the
// outage is complete (its follower waited and went on from the last stored
// chunk). SQLite has no server to lose, so this runs on Postgres only.
func TestTerminalDatabaseOutage(t *testing.T) {
	t.Parallel()
	var cut *dbCutter
	f := newTerminalFixture(t, store.Postgres, func(c *config.Config) { cut = cutDatabase(t, c) })
	ctx := context.Background()

	// A counter running across the outage, and a TTY the outage's stdin,
	// resize and kill aim at.
	const lines = 80
	r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{
		"command": fmt.Sprintf("for i in $(seq 1 %d); do echo $i; sleep 0.05; done", lines)})
	wantStatus(t, "exec the counter", r, http.StatusCreated)
	var counter outputJSON
	r.decode(t, &counter)
	r = f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "cat", "tty": true})
	wantStatus(t, "exec cat", r, http.StatusCreated)
	var tty outputJSON
	r.decode(t, &tty)
	// The followers of both poll agentd throughout; those are the only
	// requests agentd may see while the database is away.
	followed := map[string]bool{}
	ten, err := f.e.c.Tenants.Open(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	if err := ten.DB.Raw("SELECT agentd_id FROM commands WHERE id IN ?", []int64{counter.CommandID, tty.CommandID}).Scan(&ids).Error; err != nil || len(ids) != 2 {
		t.Fatalf("agentd ids of the commands: %v %v", ids, err)
	}
	ten.Release()
	for _, id := range ids {
		followed["GET /v1/sessions/"+id] = true
	}
	r = f.call(http.MethodGet, f.sessionPath("/commands/%d/output?cursor=0&wait_ms=2000", counter.CommandID), "member", nil)
	wantStatus(t, "first output", r, http.StatusOK)

	before := len(f.agentd.callsSince(0))
	cut.Cut()
	fetchURL := "http://127.0.0.1:1/never"
	for _, op := range []struct {
		name, method, path string
		body               any
	}{
		{"exec", http.MethodPost, "/commands", map[string]any{"command": "echo never"}},
		{"stdin", http.MethodPost, fmt.Sprintf("/commands/%d/stdin", tty.CommandID), map[string]any{"text": "never\n"}},
		{"resize", http.MethodPost, fmt.Sprintf("/commands/%d/resize", tty.CommandID), map[string]any{"rows": 30, "cols": 100}},
		{"kill", http.MethodDelete, fmt.Sprintf("/commands/%d", tty.CommandID), nil},
		{"read a file", http.MethodGet, "/files?path=note.txt", nil},
		{"stat", http.MethodPost, "/files/stat", map[string]any{"paths": []string{"note.txt"}}},
		{"fetch", http.MethodPost, "/files/fetch", map[string]any{"url": fetchURL, "path": "never.txt"}},
		{"history", http.MethodGet, "/commands", nil},
	} {
		r := f.call(op.method, f.sessionPath("%s", op.path), "member", op.body)
		if r.status != http.StatusServiceUnavailable {
			t.Errorf("%s with the database cut: %d %s, want 503", op.name, r.status, r.body)
			continue
		}
		if code := r.envelope(t).Error.Code; code != "audit_unavailable" && code != "database_unavailable" {
			t.Errorf("%s with the database cut: code %q, want audit_unavailable or database_unavailable", op.name, code)
		}
	}
	// A poll of the live counter writes nothing: while this replica holds
	// the caller's credential from the last second it may be answered from
	// agentd (running, with output), else 503 — whatever the caches hold,
	// one of the two (docs/terminal-gateway.md, "A database outage").
	poll := fmt.Sprintf("/commands/%d/output?cursor=0&wait_ms=100", counter.CommandID)
	r = f.call(http.MethodGet, f.sessionPath("%s", poll), "member", nil)
	switch r.status {
	case http.StatusOK:
		var o outputJSON
		r.decode(t, &o)
		if o.State != "running" {
			t.Errorf("poll with the database cut answered from agentd: state %q, want running", o.State)
		}
	case http.StatusServiceUnavailable:
	default:
		t.Errorf("poll with the database cut: %d %s, want 200 (from agentd) or 503", r.status, r.body)
	}
	// The counter keeps running meanwhile; give it time to print across
	// the outage. Past the credential cache's second, a poll must read the
	// credential again and cannot.
	time.Sleep(1500 * time.Millisecond)
	r = f.call(http.MethodGet, f.sessionPath("%s", poll), "member", nil)
	if r.status != http.StatusServiceUnavailable {
		t.Errorf("poll %s into the outage: %d %s, want 503", 1500*time.Millisecond, r.status, r.body)
	}
	for _, call := range f.agentd.callsSince(before) {
		if !followed[call] {
			t.Errorf("agentd received %q while the database was cut", call)
		}
	}
	cut.Restore()

	// The same console runs commands again: its pools drop the dead
	// connections (a first call may still meet one and answer 503, as a
	// client retrying after Retry-After would see).
	var back outputJSON
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "echo back", "wait_ms": 5000})
		if r.status == http.StatusCreated {
			r.decode(t, &back)
			break
		}
		if r.status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("exec after the database came back: %d %s", r.status, r.body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if back.State != "exited" || len(back.Chunks) != 1 || string(back.Chunks[0].Data) != "back\n" {
		t.Fatalf("exec after the outage: %+v", back)
	}
	wantStatus(t, "kill cat", f.call(http.MethodDelete, f.sessionPath("/commands/%d", tty.CommandID), "member", nil), http.StatusOK)

	// The counter's recording holds every line once, as agentd printed it.
	end := waitCommandEnded(t, f, counter.CommandID)
	if end.State != "exited" {
		t.Fatalf("counter ended %+v", end)
	}
	out := map[string]*bytes.Buffer{}
	f.drain(t, "member", counter.CommandID, 0, out)
	wantCounter(t, out["stdout"].String(), lines)
	r = f.call(http.MethodPost, "/audit/verify", "admin", nil)
	wantStatus(t, "audit verify", r, http.StatusOK)
	var v struct{ OK bool }
	r.decode(t, &v)
	if !v.OK {
		t.Fatalf("audit verify after the outage: %s", r.body)
	}
}

// wantCounter checks that out is the lines 1..n, each exactly once.
func wantCounter(t *testing.T, out string, n int) {
	t.Helper()
	var want strings.Builder
	for i := 1; i <= n; i++ {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	if out == want.String() {
		return
	}
	got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	seen := map[string]int{}
	for _, l := range got {
		seen[l]++
	}
	var problems []error
	for i := 1; i <= n; i++ {
		if c := seen[strconv.Itoa(i)]; c != 1 {
			problems = append(problems, fmt.Errorf("line %d appears %d times", i, c))
		}
	}
	t.Fatalf("recorded output is not 1..%d once each (%d lines): %v", n, len(got), errors.Join(problems...))
}
