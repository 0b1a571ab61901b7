package handlers_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// wantSecretNowhere fails the test when secret shows anywhere a person or
// a program could read it: every response the fixture received, the pages
// of the given sessions (as their user and as an org admin), their JSON,
// the audit export (JSONL and CSV), every recorded output and input chunk
// of their commands, and every line the console logged.
func wantSecretNowhere(t *testing.T, f *terminalFixture, secret string, sessionIDs ...int64) {
	t.Helper()
	sources := map[string][]byte{"API responses": f.bodies.Bytes()}
	for _, sid := range sessionIDs {
		for _, who := range []string{"member", "admin"} {
			path := fmt.Sprintf("/o/acme/sessions/%d", sid)
			r := f.e.do(request{method: http.MethodGet, path: path, cookies: []*http.Cookie{{Name: "gh_org_acme", Value: f.tokens[who]}}})
			wantStatus(t, "page "+path+" as "+who, r, http.StatusOK)
			sources["page "+path+" as "+who] = r.body
		}
		sources[fmt.Sprintf("session %d JSON", sid)] = f.call(http.MethodGet, fmt.Sprintf("/sessions/%d", sid), "member", nil).body
	}
	for _, format := range []string{"jsonl", "csv"} {
		r := f.call(http.MethodGet, "/audit/export?format="+format, "admin", nil)
		wantStatus(t, "audit export "+format, r, http.StatusOK)
		sources["audit export "+format] = r.body
	}
	ten, err := f.e.c.Tenants.Open(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	defer ten.Release()
	var ids []int64
	if err := ten.DB.Raw("SELECT id FROM commands WHERE session_id IN ?", sessionIDs).Scan(&ids).Error; err != nil {
		t.Fatal(err)
	}
	if len(ids) == 0 {
		t.Fatal("no command was recorded to look through")
	}
	var rec bytes.Buffer
	for _, id := range ids {
		for _, kind := range []string{recordings.KindOut, recordings.KindIn} {
			chunks, err := recordings.Read(context.Background(), ten.DB, id, kind)
			if err != nil {
				t.Fatal(err)
			}
			for _, ch := range chunks {
				rec.Write(ch.Data)
			}
		}
	}
	sources["recordings"] = rec.Bytes()
	sources["console log"] = []byte(f.e.logs.String())
	for name, b := range sources {
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("the environment's agentd token shows in %s", name)
		}
	}
}

// TestTerminalTokenNowhere runs every kind of terminal operation, the
// refused and failing ones too, and then looks for the environment's agentd
// token everywhere it could leak.
func TestTerminalTokenNowhere(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		exec := func(body map[string]any, want int) outputJSON {
			t.Helper()
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", body)
			wantStatus(t, fmt.Sprintf("exec %v", body["command"]), r, want)
			var o outputJSON
			if want == http.StatusCreated {
				r.decode(t, &o)
			}
			return o
		}
		// What a command can see of its environment is recorded.
		env := exec(map[string]any{"command": "env; printf 'secret here?' > note.txt", "wait_ms": 5000}, http.StatusCreated)
		exec(map[string]any{"command": "rm -rf / --no-preserve-root"}, http.StatusForbidden)
		tty := exec(map[string]any{"command": "cat", "tty": true}, http.StatusCreated)
		wantStatus(t, "stdin", f.call(http.MethodPost, f.sessionPath("/commands/%d/stdin", tty.CommandID), "member", map[string]any{"text": "typed\n"}), http.StatusNoContent)
		wantStatus(t, "resize", f.call(http.MethodPost, f.sessionPath("/commands/%d/resize", tty.CommandID), "member", map[string]any{"rows": 30, "cols": 90}), http.StatusNoContent)
		wantStatus(t, "kill", f.call(http.MethodDelete, f.sessionPath("/commands/%d", tty.CommandID), "member", nil), http.StatusOK)
		wantStatus(t, "read", f.call(http.MethodGet, f.sessionPath("/files?path=note.txt"), "member", nil), http.StatusOK)
		wantStatus(t, "read a missing file", f.call(http.MethodGet, f.sessionPath("/files?path=missing.txt"), "member", nil), http.StatusNotFound)
		wantStatus(t, "stat", f.call(http.MethodPost, f.sessionPath("/files/stat"), "member", map[string]any{"paths": []string{"note.txt"}}), http.StatusOK)
		// A download agentd cannot make fails with agentd's own words.
		r := f.call(http.MethodPost, f.sessionPath("/files/fetch"), "member", map[string]any{"url": "http://127.0.0.1:1/x", "path": "x"})
		if r.status < 400 {
			t.Fatalf("fetch from a closed port: %d %s", r.status, r.body)
		}
		for _, cid := range []int64{env.CommandID, tty.CommandID} {
			waitCommandEnded(t, f, cid)
			f.drain(t, "member", cid, 0, map[string]*bytes.Buffer{})
		}
		f.call(http.MethodGet, f.sessionPath("/commands"), "member", nil)
		wantSecretNowhere(t, f, f.agentd.token, f.session)
	})
}
