package handlers_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// outputMeter is a real agentd that measures what it serves of command
// output: the bytes of every poll answer, and how many polls were peeks
// (ack=false: a client's read, not the recorder's).
type outputMeter struct {
	url, token string
	mu         sync.Mutex
	served     int64
	peeks      int
	reads      int
}

type meteredWriter struct {
	http.ResponseWriter
	n int64
}

func (w *meteredWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.n += int64(n)
	return n, err
}

func startOutputMeter(t *testing.T) *outputMeter {
	t.Helper()
	m := &outputMeter{token: "agentd-token-" + randomHex(12)}
	srv, err := agentd.NewServer(agentd.Config{Token: m.token, Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/v1/sessions/") {
			srv.Handler().ServeHTTP(w, r)
			return
		}
		mw := &meteredWriter{ResponseWriter: w}
		srv.Handler().ServeHTTP(mw, r)
		m.mu.Lock()
		m.served += mw.n
		m.reads++
		if r.URL.Query().Get("ack") == "false" {
			m.peeks++
		}
		m.mu.Unlock()
	}))
	m.url = ts.URL
	t.Cleanup(func() {
		srv.Close()
		ts.Close()
	})
	return m
}

// TestOutputReadFromAgentdOnce proves each output byte of a recorded
// command is read from agentd once: two clients long-polling a live
// command through the gateway are answered from what its follower read,
// so agentd serves the output once (the recorder's reads), not once more
// per client, and both clients and the recording get every byte.
func TestOutputReadFromAgentdOnce(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := &terminalFixture{orgFixture: newOrgFixture(t, d), bodies: &bytes.Buffer{}}
		m := startOutputMeter(t)
		f.agentID, f.session = f.hostSession(t, "metered-host", m.url, m.token)
		// About 1 MB over a second or so: live while both clients read.
		const lines, width = 100, 10000
		r := f.call(http.MethodPost, f.sessionPath("/commands"), "member", map[string]any{
			"command": "for i in $(seq 1 100); do head -c 9999 /dev/zero | tr '\\0' x; echo; sleep 0.01; done"})
		wantStatus(t, "exec", r, http.StatusCreated)
		var started outputJSON
		r.decode(t, &started)
		// The second client reads in its own goroutine (reporting, not
		// failing, there); the first in the test's.
		outs := []map[string]*bytes.Buffer{{}, {}}
		ends := make([]outputJSON, 2)
		second := make(chan error, 1)
		go func() {
			var err error
			ends[1], err = f.drainQuietly("member", started.CommandID, outs[1])
			second <- err
		}()
		ends[0] = f.drain(t, "member", started.CommandID, 0, outs[0])
		if err := <-second; err != nil {
			t.Fatal(err)
		}
		want := int64(lines * width)
		for i, out := range outs {
			if out["stdout"] == nil || int64(out["stdout"].Len()) != want || ends[i].State != "exited" {
				t.Fatalf("client %d read %d bytes and ended %q, want %d and exited", i, out["stdout"].Len(), ends[i].State, want)
			}
		}
		m.mu.Lock()
		served, peeks, reads := m.served, m.peeks, m.reads
		m.mu.Unlock()
		if peeks != 0 || served > want*5/4 {
			t.Fatalf("agentd served %d bytes of output in %d polls (%d of them clients' peeks) for %d bytes written: read more than once",
				served, reads, peeks, want)
		}
		// The recording has it all too, once its end is recorded (just
		// after the clients read it).
		deadline := time.Now().Add(30 * time.Second)
		for {
			r = f.call(http.MethodGet, f.sessionPath("/commands?limit=1"), "member", nil)
			wantStatus(t, "history", r, http.StatusOK)
			var hist struct {
				Items []struct {
					State       string `json:"state"`
					OutputBytes int64  `json:"output_bytes"`
				} `json:"items"`
			}
			r.decode(t, &hist)
			if len(hist.Items) == 1 && hist.Items[0].State == "exited" {
				if hist.Items[0].OutputBytes != want {
					t.Fatalf("recorded %d bytes, want %d", hist.Items[0].OutputBytes, want)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the command's end is not recorded after 30 s: %+v", hist.Items)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// drainQuietly is drain for a goroutine other than the test's: it
// returns what went wrong instead of failing the test.
func (f *terminalFixture) drainQuietly(who string, cid int64, out map[string]*bytes.Buffer) (outputJSON, error) {
	tok := f.tokens[who]
	if k, ok := f.keys[who]; ok {
		tok = k
	}
	cursor := uint64(0)
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Not f.call: its record of bodies belongs to the test's goroutine.
		r := f.e.json(http.MethodGet, "/api/v1/orgs/acme"+f.sessionPath("/commands/%d/output?cursor=%d&wait_ms=2000", cid, cursor), tok, nil)
		if r.status != http.StatusOK {
			return outputJSON{}, fmt.Errorf("poll output: status %d: %s", r.status, r.body)
		}
		var o outputJSON
		if err := json.Unmarshal(r.body, &o); err != nil {
			return o, err
		}
		for _, ch := range o.Chunks {
			if ch.ID <= cursor {
				return o, fmt.Errorf("chunk %d returned again after cursor %d", ch.ID, cursor)
			}
			if out[ch.Stream] == nil {
				out[ch.Stream] = &bytes.Buffer{}
			}
			out[ch.Stream].Write(ch.Data)
			cursor = ch.ID
		}
		cursor = max(cursor, o.NextCursor)
		if o.State != "running" && !o.More {
			return o, nil
		}
		if time.Now().After(deadline) {
			return o, fmt.Errorf("command %d still %s after 30 s", cid, o.State)
		}
	}
}
