package e2bfaketest

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

func listenLoopback() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

// standInSession mirrors the fields of agentd's session answer the sandbox
// tests read; []byte data marshals as base64 like agentd's chunks.
type standInChunk struct {
	ID     uint64 `json:"id"`
	Stream string `json:"stream"`
	Data   []byte `json:"data"`
}

type standInSession struct {
	SessionID string         `json:"session_id"`
	PID       int            `json:"pid,omitempty"`
	State     string         `json:"state"`
	ExitCode  *int           `json:"exit_code"`
	Chunks    []standInChunk `json:"chunks"`
}

// serveStandIn is a minimal agentd: the launch contract (--listen,
// --addr-file, --root, AGENTD_TOKEN, the "agentd listening on" line),
// GET /healthz and POST /v1/sessions {command, wait_ms}. Commands run in
// the root through /bin/sh; one that outlives wait_ms is left running and
// answered as running, so tests can watch it freeze.
func serveStandIn(args []string) int {
	fs := flag.NewFlagSet("agentd", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "")
	addrFile := fs.String("addr-file", "", "")
	root := fs.String("root", ".", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	token := os.Getenv("AGENTD_TOKEN")
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentd:", err)
		return 1
	}
	var mu sync.Mutex
	seq := 0
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "ok", "version": "stand-in"})
	})
	mux.HandleFunc("POST /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"code":"unauthorized","message":"Missing or wrong token."}}`))
			return
		}
		var req struct {
			Command string `json:"command"`
			WaitMS  int64  `json:"wait_ms"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		seq++
		id := "s" + strconv.Itoa(seq)
		mu.Unlock()
		var out lockedBuffer
		cmd := exec.Command("/bin/sh", "-c", req.Command)
		cmd.Dir = *root
		cmd.Stdout = &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		ctx, cancel := context.WithTimeout(r.Context(), time.Duration(req.WaitMS)*time.Millisecond)
		defer cancel()
		resp := standInSession{SessionID: id, PID: cmd.Process.Pid, State: "running", Chunks: []standInChunk{}}
		select {
		case err := <-done:
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			resp.State, resp.ExitCode = "exited", &code
			if b := out.Bytes(); len(b) > 0 {
				resp.Chunks = append(resp.Chunks, standInChunk{ID: 1, Stream: "stdout", Data: b})
			}
		case <-ctx.Done():
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	})
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile, []byte(ln.Addr().String()), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "agentd:", err)
			return 1
		}
	}
	fmt.Fprintf(os.Stderr, "agentd listening on %s\n", ln.Addr())
	if err := http.Serve(ln, mux); err != nil {
		fmt.Fprintln(os.Stderr, "agentd:", err)
		return 1
	}
	return 0
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *lockedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf...)
}
