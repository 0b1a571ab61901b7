package handlers_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// putFile sends raw bytes to the gateway's file write as who.
func (f *terminalFixture) putFile(t *testing.T, who, query string, body []byte) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, f.e.srv.URL+"/api/v1/orgs/acme"+f.sessionPath("/files?%s", query), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	tok := f.tokens[who]
	if k, ok := f.keys[who]; ok {
		tok = k
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	f.bodies.Write(b)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// TestTerminalFileWrite writes through the gateway into a real agentd's
// workspace: the write is authorized as files.write, audited with path,
// size and SHA-256 (never the contents) before agentd hears of it, and
// not forwarded at all when its audit record cannot be written.
func TestTerminalFileWrite(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		content := []byte("the file's secret contents " + randomHex(8) + "\n" + strings.Repeat("x", 3<<20))
		sum := sha256.Sum256(content)
		want := hex.EncodeToString(sum[:])

		t.Run("a member writes a file larger than a JSON body may be", func(t *testing.T) {
			r := f.putFile(t, "member", "path=notes/plan.txt&mode=0640", content)
			wantStatus(t, "write", r, http.StatusOK)
			var res struct {
				Path   string `json:"path"`
				Size   int64  `json:"size"`
				SHA256 string `json:"sha256"`
			}
			r.decode(t, &res)
			if res.Size != int64(len(content)) || res.SHA256 != want || !strings.HasSuffix(res.Path, "notes/plan.txt") {
				t.Fatalf("answer %+v", res)
			}
			back := f.call(http.MethodGet, f.sessionPath("/files?path=notes/plan.txt"), "member", nil)
			wantStatus(t, "read back", back, http.StatusOK)
			if !bytes.Equal(back.body, content) {
				t.Fatalf("read back %d bytes, not what was written", len(back.body))
			}
			r = f.call(http.MethodPost, f.sessionPath("/files/stat"), "member", map[string]any{"paths": []string{"notes/plan.txt"}})
			if !strings.Contains(string(r.body), `"mode":"0640"`) {
				t.Fatalf("mode not honoured: %s", r.body)
			}
		})

		t.Run("the write is audited with path, size and hash, never contents", func(t *testing.T) {
			evs, err := openAudit(t, f.orgFixture).Query(context.Background(), mustParse(t, "action:file.write"), 0, 10)
			if err != nil || len(evs) != 1 {
				t.Fatalf("%d file.write events: %v", len(evs), err)
			}
			var det map[string]any
			json.Unmarshal(evs[0].Details, &det)
			if det["sha256"] != want || det["size"] != float64(len(content)) || !strings.HasSuffix(fmt.Sprint(det["path"]), "notes/plan.txt") || det["mode"] != "0640" {
				t.Fatalf("details %s", evs[0].Details)
			}
			if bytes.Contains(evs[0].Details, []byte("secret contents")) {
				t.Fatal("the audit record holds the file's contents")
			}
		})

		t.Run("refusals", func(t *testing.T) {
			for _, tc := range []struct {
				name, who, query string
				status           int
				code             string
			}{
				{"no path", "member", "", http.StatusBadRequest, "validation_failed"},
				{"setuid mode", "member", "path=x&mode=4755", http.StatusBadRequest, "validation_failed"},
				{"leaving the root", "member", "path=../../../../../../../../etc/evil", http.StatusForbidden, "path_outside_root"},
				{"an auditor may only read", "auditor", "path=x", http.StatusForbidden, ""},
			} {
				before := len(f.agentd.callsSince(0))
				r := f.putFile(t, tc.who, tc.query, []byte("x"))
				if r.status != tc.status {
					t.Errorf("%s: %d %s", tc.name, r.status, r.body)
					continue
				}
				if tc.code != "" && r.envelope(t).Error.Code != tc.code {
					t.Errorf("%s: code %s", tc.name, r.body)
				}
				if tc.code != "path_outside_root" {
					for _, c := range f.agentd.callsSince(before) {
						if c == "PUT /v1/files" {
							t.Errorf("%s reached agentd", tc.name)
						}
					}
				}
			}
		})

		t.Run("a pinned fetch that does not match writes nothing", func(t *testing.T) {
			payload := []byte("downloaded skill")
			src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(payload) }))
			defer src.Close()
			got := sha256.Sum256(payload)
			wrong := strings.Repeat("0", 64)
			r := f.call(http.MethodPost, f.sessionPath("/files/fetch"), "member", map[string]any{"url": src.URL, "path": "pinned.txt", "sha256": wrong})
			wantStatus(t, "mismatched fetch", r, http.StatusBadRequest)
			e := r.envelope(t)
			if e.Error.Code != "checksum_mismatch" || !strings.Contains(e.Error.Message, wrong) || !strings.Contains(e.Error.Message, hex.EncodeToString(got[:])) {
				t.Fatalf("answer %s", r.body)
			}
			wantStatus(t, "the mismatched file", f.call(http.MethodGet, f.sessionPath("/files?path=pinned.txt"), "member", nil), http.StatusNotFound)
			r = f.call(http.MethodPost, f.sessionPath("/files/fetch"), "member", map[string]any{"url": src.URL, "path": "pinned.txt", "sha256": hex.EncodeToString(got[:])})
			wantStatus(t, "matching fetch", r, http.StatusOK)
			if !strings.Contains(string(r.body), hex.EncodeToString(got[:])) {
				t.Fatalf("answer %s", r.body)
			}
			r = f.call(http.MethodPost, f.sessionPath("/files/fetch"), "member", map[string]any{"url": src.URL, "path": "x", "sha256": "nothex"})
			wantStatus(t, "a malformed pin", r, http.StatusBadRequest)
		})

		t.Run("nothing is forwarded when the audit record cannot be written", func(t *testing.T) {
			failAudit(t, f.orgFixture, d, "file.write")
			before := len(f.agentd.callsSince(0))
			r := f.putFile(t, "member", "path=notes/unaudited.txt", []byte("never"))
			wantStatus(t, "write with the audit failing", r, http.StatusServiceUnavailable)
			for _, c := range f.agentd.callsSince(before) {
				if c == "PUT /v1/files" {
					t.Fatal("an unaudited write reached agentd")
				}
			}
			back := f.call(http.MethodGet, f.sessionPath("/files?path=notes/unaudited.txt"), "member", nil)
			wantStatus(t, "the unaudited file", back, http.StatusNotFound)
		})
	})
}

// TestTerminalFileWriteMismatch: an agentd answering a write with another
// hash than the bytes sent is reported (502 write_mismatch), not believed,
// and the audit log records the mismatch with both hashes after the
// file.write it contradicts.
func TestTerminalFileWriteMismatch(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		h := startHostileAgentd(t, func(h *hostileAgentd, w http.ResponseWriter, r *http.Request) bool {
			if r.Method != http.MethodPut || r.URL.Path != "/v1/files" {
				return false
			}
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"path":"x","size":5,"sha256":"` + strings.Repeat("0", 64) + `"}` + "\n"))
			return true
		})
		_, session := f.hostSession(t, "lying-host", h.url, h.token)
		req, err := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/api/v1/orgs/acme/sessions/%d/files?path=x", f.e.srv.URL, session), strings.NewReader("hello"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+f.tokens["member"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "write_mismatch") {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		evs := f.auditEvents(t, "action:file.write_mismatch")
		if len(evs) != 1 {
			t.Fatalf("%d file.write_mismatch events, want 1", len(evs))
		}
		sum := sha256.Sum256([]byte("hello"))
		det := evs[0].Details
		if det["sent_sha256"] != hex.EncodeToString(sum[:]) || det["stored_sha256"] != strings.Repeat("0", 64) || det["sent_size"] != 5.0 || det["stored_size"] != 5.0 {
			t.Errorf("file.write_mismatch details %v, want both sizes and hashes", det)
		}
	})
}

// TestTerminalFileFetchMismatch: an agentd that ignores a fetch's pin and
// stores other bytes is reported (502 fetch_mismatch), not believed, and
// the audit log records the mismatch with both hashes after the
// file.fetch it contradicts.
func TestTerminalFileFetchMismatch(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		h := startHostileAgentd(t, func(h *hostileAgentd, w http.ResponseWriter, r *http.Request) bool {
			if r.Method != http.MethodPost || r.URL.Path != "/v1/files/fetch" {
				return false
			}
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"path":"x","size":5,"sha256":"` + strings.Repeat("0", 64) + `"}` + "\n"))
			return true
		})
		_, session := f.hostSession(t, "pin-ignoring-host", h.url, h.token)
		pin := strings.Repeat("a", 64)
		r := f.call(http.MethodPost, fmt.Sprintf("/sessions/%d/files/fetch", session), "member",
			map[string]any{"url": "https://downloads.example/x.tar.gz", "path": "x", "sha256": pin})
		wantStatus(t, "fetch", r, http.StatusBadGateway)
		if env := r.envelope(t); env.Error.Code != "fetch_mismatch" {
			t.Fatalf("answer %s", r.body)
		}
		evs := f.auditEvents(t, "action:file.fetch")
		var actions []string
		for _, e := range evs {
			actions = append(actions, e.Action)
		}
		if len(evs) != 2 || evs[0].Action != "file.fetch" || evs[1].Action != "file.fetch_mismatch" {
			t.Fatalf("events %v, want file.fetch then file.fetch_mismatch", actions)
		}
		if det := evs[1].Details; det["pinned_sha256"] != pin || det["stored_sha256"] != strings.Repeat("0", 64) {
			t.Errorf("file.fetch_mismatch details %v, want both hashes", det)
		}
	})
}
