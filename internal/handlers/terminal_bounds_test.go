package handlers_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// Regression tests for issue 21 item 3: every duration and size a client
// gives the terminal API is checked before anything is audited or
// forwarded, and what the console reads of agentd's answers is bounded,
// so a root user in a sandbox who replaces agentd cannot exhaust the
// console's memory; file reads are passed on, not held.

// TestTerminalRefusesOutOfRangeDurationsAndSizes sends each out-of-range
// value once: each is a 400 naming the field and its range, nothing
// reaches agentd or the audit log, and the session stays running (a fetch
// timeout of 1e13 ms used to overflow into an immediate deadline, which
// counted as an agentd failure).
func TestTerminalRefusesOutOfRangeDurationsAndSizes(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		// A first operation makes the session running.
		wantStatus(t, "stat", f.call(http.MethodPost, f.sessionPath("/files/stat"), "member", map[string]any{"paths": []string{"."}}), http.StatusOK)
		before := f.agentd.requests.Load()
		state := func() string {
			r := f.call(http.MethodGet, f.sessionPath(""), "member", nil)
			var sess struct{ State string }
			r.decode(t, &sess)
			return sess.State
		}
		fetch := func(extra map[string]any) map[string]any {
			body := map[string]any{"url": "https://example.test/data.csv", "path": "data.csv"}
			for k, v := range extra {
				body[k] = v
			}
			return body
		}
		tests := []struct {
			name, method, path string
			body               map[string]any
			field, rangeText   string
		}{
			{"fetch timeout_ms of 1e13", http.MethodPost, "/files/fetch", fetch(map[string]any{"timeout_ms": int64(1e13)}), "timeout_ms", "600000"},
			{"negative fetch timeout_ms", http.MethodPost, "/files/fetch", fetch(map[string]any{"timeout_ms": -1}), "timeout_ms", "600000"},
			{"fetch max_bytes over 1 GiB", http.MethodPost, "/files/fetch", fetch(map[string]any{"max_bytes": int64(1<<30 + 1)}), "max_bytes", "1073741824"},
			{"negative fetch max_bytes", http.MethodPost, "/files/fetch", fetch(map[string]any{"max_bytes": -5}), "max_bytes", "1073741824"},
			{"exec timeout_ms over 7 days", http.MethodPost, "/commands", map[string]any{"command": "true", "timeout_ms": int64(7*24*3600*1000 + 1)}, "timeout_ms", "604800000"},
			{"exec timeout_ms of 1e13", http.MethodPost, "/commands", map[string]any{"command": "true", "timeout_ms": int64(1e13)}, "timeout_ms", "604800000"},
			{"exec wait_ms over 60 s", http.MethodPost, "/commands", map[string]any{"command": "true", "wait_ms": 60001}, "wait_ms", "60000"},
			{"negative exec wait_ms", http.MethodPost, "/commands", map[string]any{"command": "true", "wait_ms": -1}, "wait_ms", "60000"},
			{"exec rows over 4096", http.MethodPost, "/commands", map[string]any{"command": "true", "tty": true, "rows": 5000, "cols": 80}, "rows", "4096"},
			{"read limit over 64 MiB", http.MethodGet, "/files?path=note.txt&limit=67108865", nil, "limit", "67108864"},
			{"read offset over 2^62", http.MethodGet, "/files?path=note.txt&offset=4611686018427387905", nil, "offset", "4611686018427387904"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				var body any
				if tt.body != nil {
					body = tt.body
				}
				r := f.call(tt.method, f.sessionPath("%s", tt.path), "member", body)
				wantStatus(t, tt.name, r, http.StatusBadRequest)
				msg, ok := r.envelope(t).Error.Fields[tt.field]
				if !ok || !strings.Contains(msg, tt.rangeText) {
					t.Fatalf("fields %s: want %s with its range (%s)", r.body, tt.field, tt.rangeText)
				}
			})
		}
		t.Run("nothing was forwarded or audited", func(t *testing.T) {
			if got := f.agentd.requests.Load(); got != before {
				t.Fatalf("agentd received %d requests for refused operations: %q", got-before, f.agentd.callsSince(int(before)))
			}
			for _, action := range []string{"file.fetch", "file.read", "command.exec"} {
				evs, err := openAudit(t, f.orgFixture).Query(context.Background(), mustParse(t, "action:"+action), 0, 10)
				if err != nil {
					t.Fatal(err)
				}
				if len(evs) != 0 {
					t.Fatalf("%d %s events were audited for refused requests", len(evs), action)
				}
			}
			if got := state(); got != "running" {
				t.Fatalf("the session is %s after refused requests", got)
			}
		})
		t.Run("the bounds themselves are accepted", func(t *testing.T) {
			r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{"command": "printf bounded > note.txt",
				"timeout_ms": int64(7 * 24 * 3600 * 1000), "wait_ms": 60000})
			wantStatus(t, "exec at the bounds", r, http.StatusCreated)
			r = f.call(http.MethodGet, f.sessionPath("/files?path=note.txt&limit=67108864&offset=0"), "member", nil)
			wantStatus(t, "read at the bound", r, http.StatusOK)
			if string(r.body) != "bounded" {
				t.Fatalf("read %q", r.body)
			}
		})
	})
}

// hostileAgentd is a real agentd behind a front that answers some
// requests as a replaced agentd would, counting what it managed to send.
type hostileAgentd struct {
	*countingAgentd
	sent atomic.Int64 // bytes of hostile answers the console accepted
}

// startHostileAgentd serves agentd, except for what hostile answers (it
// returns false to let agentd answer).
func startHostileAgentd(t *testing.T, hostile func(h *hostileAgentd, w http.ResponseWriter, r *http.Request) bool) *hostileAgentd {
	t.Helper()
	h := &hostileAgentd{countingAgentd: &countingAgentd{token: "agentd-token-" + randomHex(12)}}
	srv, err := agentd.NewServer(agentd.Config{Token: h.token, Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	h.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && hostile(h, w, r) {
			return
		}
		srv.Handler().ServeHTTP(w, r)
	}))
	h.url = h.ts.URL
	t.Cleanup(func() {
		srv.Close()
		h.ts.Close()
	})
	return h
}

// send writes parts, then fill up to total bytes, counting what the
// console accepted, and stops when it stops reading; it reports whether
// everything was written.
func (h *hostileAgentd) send(w http.ResponseWriter, total int64, fill []byte, parts ...[]byte) bool {
	var n int64
	for _, p := range parts {
		m, err := w.Write(p)
		n += int64(m)
		h.sent.Add(int64(m))
		if err != nil {
			return false
		}
	}
	for n < total {
		p := fill[:min(int64(len(fill)), total-n)]
		m, err := w.Write(p)
		n += int64(m)
		h.sent.Add(int64(m))
		if err != nil {
			return false
		}
	}
	return true
}

// TestTerminalHostileAgentdAnswers points a session at an agentd whose
// answers are far larger than any real agentd's: the console answers 502
// "too large" (or breaks off a file it began to pass on), having read no
// more than its cap of each, and the session stays usable.
func TestTerminalHostileAgentdAnswers(t *testing.T) {
	t.Parallel()
	const huge = 48 << 20 // what the hostile agentd tries to send
	// sentBound is what the hostile agentd can get accepted with a cap of
	// at most 16 MiB: the cap plus what loopback sockets buffer.
	const sentBound = 32 << 20
	fill := bytes.Repeat([]byte("A"), 64<<10)
	head := []byte(`{"session_id":"x","state":"running","exit_code":null,"chunks":[],"next_cursor":0,"more":false,"truncated":false,"dropped_bytes":0}` + "\n")
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		h := startHostileAgentd(t, func(h *hostileAgentd, w http.ResponseWriter, r *http.Request) bool {
			switch {
			case r.Method == http.MethodPost && r.URL.Path == "/v1/files/stat":
				// A valid answer of 48 MiB: one path of nearly all of it.
				w.Header().Set("Content-Type", "application/json")
				h.send(w, huge, fill, []byte(`{"results":[{"path":"`))
				h.send(w, 0, nil, []byte(`","exists":false,"size":0}]}`))
			case r.Method == http.MethodGet && r.URL.Path == "/v1/files" && strings.HasSuffix(r.URL.Query().Get("path"), "announced"):
				// A file read announcing 48 MiB, over the 1 MiB asked.
				w.Header().Set("Content-Length", strconv.Itoa(huge))
				w.Header().Set(agentd.FileHeaderSize, strconv.Itoa(huge))
				h.send(w, huge, fill)
			case r.Method == http.MethodGet && r.URL.Path == "/v1/files" && strings.HasSuffix(r.URL.Query().Get("path"), "endless"):
				// A file read without a length, going on past the 1 MiB asked.
				w.Header().Set(agentd.FileHeaderSize, strconv.Itoa(huge))
				h.send(w, huge, fill)
			case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/sessions/"):
				// Every output read (the recorder's, and a reader's peek
				// once the recorder is stalled) answered with 48 MiB of
				// binary output, each frame honest, announced in the
				// Content-Length.
				const frames = huge / (13 + 64<<10)
				w.Header().Set("Content-Type", agentd.ChunksMediaType)
				w.Header().Set("Content-Length", strconv.Itoa(len(head)+frames*(13+len(fill))))
				h.send(w, 0, nil, head)
				for id := uint64(1); id <= frames; id++ {
					var fh [13]byte
					binary.BigEndian.PutUint64(fh[0:8], id)
					binary.BigEndian.PutUint32(fh[9:13], uint32(len(fill)))
					if !h.send(w, 0, nil, fh[:], fill) {
						break
					}
				}
			default:
				return false
			}
			return true
		})
		_, session := f.hostSession(t, "hostile-host", h.url, h.token)
		path := func(format string, args ...any) string {
			return fmt.Sprintf("/sessions/%d", session) + fmt.Sprintf(format, args...)
		}
		tooLarge := func(t *testing.T, what string, r response) {
			t.Helper()
			if r.status != http.StatusBadGateway {
				t.Fatalf("%s: status %d, want 502; body: %.300s", what, r.status, r.body)
			}
			e := r.envelope(t)
			if e.Error.Code != agentd.CodeAnswerTooLarge || !strings.Contains(e.Error.Message, "answer was too large") {
				t.Fatalf("%s: %s", what, r.body)
			}
			if sent := h.sent.Swap(0); sent > sentBound {
				t.Fatalf("%s: the console accepted %d bytes of the answer", what, sent)
			}
		}

		t.Run("an oversize JSON answer", func(t *testing.T) {
			tooLarge(t, "stat", f.call(http.MethodPost, path("/files/stat"), "member", map[string]any{"paths": []string{"x"}}))
		})
		t.Run("a file read announcing more than asked", func(t *testing.T) {
			tooLarge(t, "read", f.call(http.MethodGet, path("/files?path=announced&limit=1048576"), "member", nil))
		})
		t.Run("a binary output answer announcing 48 MiB", func(t *testing.T) {
			r := f.call(http.MethodPost, path("/commands"), "member", map[string]any{"command": "sleep 30"})
			wantStatus(t, "exec", r, http.StatusCreated)
			var o outputJSON
			r.decode(t, &o)
			// Clients are answered from what the recorder read; its read
			// is refused (too large), so it stalls and a client's poll
			// reads agentd itself, and is refused the same way. Until the
			// recorder has tried, a poll may answer that nothing came.
			var poll response
			for deadline := time.Now().Add(30 * time.Second); ; {
				poll = f.call(http.MethodGet, path("/commands/%d/output?cursor=0&wait_ms=200", o.CommandID), "member", nil)
				if poll.status != http.StatusOK || time.Now().After(deadline) {
					break
				}
			}
			tooLarge(t, "poll", poll)
			wantStatus(t, "kill", f.call(http.MethodDelete, path("/commands/%d", o.CommandID), "member", nil), http.StatusOK)
		})
		t.Run("a file read going on past what was asked", func(t *testing.T) {
			// The console passes the file on as it arrives, so it has
			// answered 200 before the excess comes: it breaks the
			// response off rather than end it as if whole.
			req, err := http.NewRequest(http.MethodGet, f.e.srv.URL+"/api/v1/orgs/acme"+path("/files?path=endless&limit=1048576"), nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+f.tokens["member"])
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, err := io.Copy(io.Discard, resp.Body)
			if err == nil {
				t.Fatalf("status %d: the client got %d bytes as a whole file", resp.StatusCode, got)
			}
			if got > 1<<20 {
				t.Fatalf("the client got %d bytes of a read limited to 1 MiB", got)
			}
			if sent := h.sent.Swap(0); sent > sentBound {
				t.Fatalf("the console accepted %d bytes of the answer", sent)
			}
		})
		t.Run("the session stays running", func(t *testing.T) {
			r := f.call(http.MethodGet, path(""), "member", nil)
			var sess struct{ State string }
			r.decode(t, &sess)
			if sess.State != "running" {
				t.Fatalf("the session is %s after oversize answers", sess.State)
			}
		})
	})
}

// TestTerminalFileReadStreams proves the console passes a file on as
// agentd sends it, audited first: the agentd here sends the second half
// only once the client has received the first, which a console holding
// the whole file before answering never lets happen.
func TestTerminalFileReadStreams(t *testing.T) {
	t.Parallel()
	const half = 1 << 20
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newTerminalFixture(t, d)
		firstHalfArrived := make(chan struct{})
		var auditedFirst, waited atomic.Bool
		log, reads := openAudit(t, f.orgFixture), mustParse(t, "action:file.read")
		h := startHostileAgentd(t, func(h *hostileAgentd, w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path != "/v1/files" {
				return false
			}
			evs, err := log.Query(context.Background(), reads, 0, 10)
			auditedFirst.Store(err == nil && len(evs) == 1 && strings.Contains(string(evs[0].Details), "big.bin"))
			w.Header().Set("Content-Length", strconv.Itoa(2*half))
			w.Header().Set(agentd.FileHeaderSize, strconv.Itoa(3*half))
			// In small pieces, as a pipe or a growing log gives them:
			// each reaches the console as a small read, and what the
			// console writes on must reach the client without waiting
			// for more (net/http holds a write's tail otherwise).
			piece := bytes.Repeat([]byte("1"), 1000)
			for sent := 0; sent < half; sent += len(piece) {
				w.Write(piece[:min(len(piece), half-sent)])
				w.(http.Flusher).Flush()
			}
			select {
			case <-firstHalfArrived:
				waited.Store(true)
			case <-time.After(90 * time.Second): // a bound, not a timing: a loaded machine may take long
			}
			w.Write(bytes.Repeat([]byte("2"), half))
			return true
		})
		_, session := f.hostSession(t, "streaming-host", h.url, h.token)
		req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/api/v1/orgs/acme/sessions/%d/files?path=big.bin", f.e.srv.URL, session), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+f.tokens["member"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get(agentd.FileHeaderSize) != strconv.Itoa(3*half) ||
			resp.ContentLength != 2*half {
			t.Fatalf("status %d, size %q, length %d", resp.StatusCode, resp.Header.Get(agentd.FileHeaderSize), resp.ContentLength)
		}
		first := make([]byte, half)
		if _, err := io.ReadFull(resp.Body, first); err != nil {
			t.Fatal(err)
		}
		close(firstHalfArrived)
		rest, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.Equal(first, bytes.Repeat([]byte("1"), half)) || !bytes.Equal(rest, bytes.Repeat([]byte("2"), half)) {
			t.Fatalf("read %d + %d bytes: %v", len(first), len(rest), err)
		}
		if !waited.Load() {
			t.Fatal("the client got the first half only after agentd sent the second: the console held the file")
		}
		if !auditedFirst.Load() {
			t.Fatal("the read was not audited before agentd received it")
		}
	})
}
