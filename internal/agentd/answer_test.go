//go:build unix

package agentd_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// Regression tests for issue 21 item 3: the client reads no more of an
// answer than an honest agentd could send, whatever the answer announces,
// so whoever replaces agentd in an environment cannot exhaust the
// console's memory through it.

// countingBody counts the bytes the client took from an answer's body.
type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// countingTransport is a transport whose answers' bodies count what the
// client read of them.
type countingTransport struct {
	base http.RoundTripper
	read atomic.Int64
}

func (t *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err == nil {
		resp.Body = countingBody{resp.Body, &t.read}
	}
	return resp, err
}

// hostileAgentd answers every request with answer, and returns a client
// of it whose transport counts what the client read.
func hostileAgentd(t *testing.T, answer http.HandlerFunc) (*agentd.Client, *countingTransport) {
	t.Helper()
	ts := httptest.NewServer(answer)
	t.Cleanup(ts.Close)
	tr := &countingTransport{base: &http.Transport{}}
	t.Cleanup(func() { tr.base.(*http.Transport).CloseIdleConnections() })
	return agentd.NewClient(ts.URL, "token", &http.Client{Transport: tr}), tr
}

// stream writes head, then repeats fill until total bytes went out or
// the client stopped reading, without a Content-Length (so chunked).
func stream(w http.ResponseWriter, status int, contentType, head string, fill []byte, total int64) {
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	sent, _ := io.WriteString(w, head)
	for n := int64(sent); n < total; n += int64(len(fill)) {
		if _, err := w.Write(fill); err != nil {
			return
		}
	}
}

// announce answers with a Content-Length far above what it sends.
func announce(w http.ResponseWriter, contentType string, length int64, body string) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.FormatInt(length, 10))
	w.Header().Set(agentd.FileHeaderSize, strconv.FormatInt(length, 10))
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, body)
}

// frameHeader is a binary output frame's header announcing n bytes.
func frameHeader(id uint64, n uint32) []byte {
	var h [13]byte
	binary.BigEndian.PutUint64(h[0:8], id)
	binary.BigEndian.PutUint32(h[9:13], n)
	return h[:]
}

func wantTooLarge(t *testing.T, err error) {
	t.Helper()
	var ae *agentd.Error
	if !errors.Is(err, agentd.ErrAnswerTooLarge) || !errors.As(err, &ae) || ae.Status != http.StatusBadGateway ||
		!strings.Contains(ae.Message, "answer was too large") {
		t.Fatalf("error %v; want a 502 answer_too_large", err)
	}
}

// TestClientCapsAnswers covers every cap of the client: each hostile
// answer fails with answer_too_large, having read at most the cap (plus
// the read-ahead of a buffer) of it.
func TestClientCapsAnswers(t *testing.T) {
	t.Parallel()
	const fill = 32 << 10
	zeros := bytes.Repeat([]byte("A"), fill)
	const binaryHead = `{"session_id":"s","state":"running","chunks":[]}` + "\n"
	tests := []struct {
		name string
		// answer is the hostile agentd.
		answer http.HandlerFunc
		// call makes the client read the answer.
		call func(c *agentd.Client) error
		// maxRead bounds what the client may read of the answer.
		maxRead int64
	}{
		{
			name: "a stat answer over the control cap, streamed",
			answer: func(w http.ResponseWriter, r *http.Request) {
				stream(w, http.StatusOK, "application/json", `{"results":[{"path":"`, zeros, 3*agentd.MaxControlAnswer)
			},
			call: func(c *agentd.Client) error {
				_, err := c.Stat(testCtx(t), "x")
				return err
			},
			maxRead: agentd.MaxControlAnswer + 1,
		},
		{
			name: "a fetch answer announcing a terabyte",
			answer: func(w http.ResponseWriter, r *http.Request) {
				announce(w, "application/json", 1<<40, `{"path":"x","size":1}`)
			},
			call: func(c *agentd.Client) error {
				_, err := c.Fetch(testCtx(t), agentd.FetchRequest{URL: "http://example.test/", Path: "x"})
				return err
			},
			maxRead: 0,
		},
		{
			name: "a JSON poll answer over the output cap, streamed",
			answer: func(w http.ResponseWriter, r *http.Request) {
				stream(w, http.StatusOK, "application/json", `{"session_id":"s","state":"running","chunks":[{"id":1,"stream":"stdout","data":"`,
					zeros, 2*agentd.MaxOutputAnswer)
			},
			call: func(c *agentd.Client) error {
				_, err := c.Poll(testCtx(t), "s", 0, 0)
				return err
			},
			maxRead: agentd.MaxOutputAnswer + 1,
		},
		{
			name: "a create answer announcing a gigabyte",
			answer: func(w http.ResponseWriter, r *http.Request) {
				announce(w, "application/json", 1<<30, `{"session_id":"s"`)
			},
			call: func(c *agentd.Client) error {
				_, err := c.CreateSession(testCtx(t), agentd.CreateSessionRequest{Command: "true"})
				return err
			},
			maxRead: 0,
		},
		{
			name: "a binary poll answer announcing a gigabyte",
			answer: func(w http.ResponseWriter, r *http.Request) {
				announce(w, agentd.ChunksMediaType, 1<<30-1, binaryHead+string(frameHeader(1, 4))+"data")
			},
			call: func(c *agentd.Client) error {
				_, err := c.Poll(testCtx(t), "s", 0, 0)
				return err
			},
			maxRead: 0,
		},
		{
			name: "a binary frame announcing 4 GiB, streamed",
			answer: func(w http.ResponseWriter, r *http.Request) {
				stream(w, http.StatusOK, agentd.ChunksMediaType, binaryHead+string(frameHeader(1, 1<<32-1)), zeros, 3*agentd.MaxOutputAnswer)
			},
			call: func(c *agentd.Client) error {
				_, err := c.Poll(testCtx(t), "s", 0, 0)
				return err
			},
			// ReadChunks reads through a 64 KiB buffer.
			maxRead: agentd.MaxOutputAnswer + 64<<10,
		},
		{
			name: "a file announcing more than the limit asked for",
			answer: func(w http.ResponseWriter, r *http.Request) {
				announce(w, "application/octet-stream", 1<<20+1, "x")
			},
			call: func(c *agentd.Client) error {
				_, err := c.OpenFile(testCtx(t), "f", 0, 1<<20)
				return err
			},
			maxRead: 0,
		},
		{
			name: "a file streamed past the limit asked for",
			answer: func(w http.ResponseWriter, r *http.Request) {
				stream(w, http.StatusOK, "application/octet-stream", "", zeros, 16<<20)
			},
			call: func(c *agentd.Client) error {
				_, _, err := c.ReadFile(testCtx(t), "f", 0, 1<<20)
				return err
			},
			maxRead: 1<<20 + 1,
		},
		{
			name: "a file without a limit streamed past the protocol's",
			answer: func(w http.ResponseWriter, r *http.Request) {
				stream(w, http.StatusOK, "application/octet-stream", "", zeros, agentd.MaxFileRead+8<<20)
			},
			call: func(c *agentd.Client) error {
				f, err := c.OpenFile(testCtx(t), "f", 0, 0)
				if err != nil {
					return err
				}
				defer f.Body.Close()
				_, err = io.Copy(io.Discard, f.Body)
				return err
			},
			maxRead: agentd.MaxFileRead + 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, tr := hostileAgentd(t, tt.answer)
			wantTooLarge(t, tt.call(c))
			if got := tr.read.Load(); got > tt.maxRead {
				t.Fatalf("the client read %d bytes of the answer; the cap allows %d", got, tt.maxRead)
			}
		})
	}
}

// TestClientBoundsErrorsAndDrains covers the answers the client reads
// only a little of: an error body and the body of an answer it does not
// decode. Neither is an error of size: a long error body is not agentd's
// envelope, and an unwanted body is closed rather than drained.
func TestClientBoundsErrorsAndDrains(t *testing.T) {
	t.Parallel()
	zeros := bytes.Repeat([]byte(" "), 32<<10)
	t.Run("an endless error body", func(t *testing.T) {
		t.Parallel()
		c, tr := hostileAgentd(t, func(w http.ResponseWriter, r *http.Request) {
			stream(w, http.StatusBadRequest, "application/json", `{"error":{"code":"bad_request","message":"`, zeros, 64<<20)
		})
		_, err := c.Stat(testCtx(t), "x")
		var ae *agentd.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Message != "the server did not answer like agentd" {
			t.Fatalf("error %v", err)
		}
		if got := tr.read.Load(); got > 64<<10 {
			t.Fatalf("the client read %d bytes of an error body", got)
		}
	})
	t.Run("an endless answer to stdin", func(t *testing.T) {
		t.Parallel()
		c, tr := hostileAgentd(t, func(w http.ResponseWriter, r *http.Request) {
			stream(w, http.StatusOK, "application/json", "", zeros, 64<<20)
		})
		if err := c.WriteStdin(testCtx(t), "s", []byte("x"), false); err != nil {
			t.Fatal(err)
		}
		if got := tr.read.Load(); got > 64<<10 {
			t.Fatalf("the client read %d bytes of an answer it does not use", got)
		}
	})
}

// TestReadChunksAllocatesWhatArrives covers the binary reader on its own,
// as the console's clients use it: a Content-Length over the cap fails
// before anything is read, and a length under the cap that the body does
// not fill fails when the body ends, having allocated what arrived.
func TestReadChunksAllocatesWhatArrives(t *testing.T) {
	t.Parallel()
	head := `{"session_id":"s","state":"running","chunks":[]}` + "\n"
	body := head + string(frameHeader(7, 3)) + "abc"
	var resp agentd.SessionResponse
	chunks, err := agentd.ReadChunks(strings.NewReader(body), int64(len(body)), &resp)
	if err != nil || len(chunks) != 1 || string(chunks[0].Data) != "abc" || chunks[0].ID != 7 || resp.SessionID != "s" {
		t.Fatalf("an honest answer: %v %+v", err, chunks)
	}
	// Bytes after the announced length belong to whatever follows.
	if chunks, err := agentd.ReadChunks(strings.NewReader(body+"trailing"), int64(len(body)), &resp); err != nil || len(chunks) != 1 {
		t.Fatalf("an answer followed by other bytes: %v %+v", err, chunks)
	}
	_, err = agentd.ReadChunks(strings.NewReader(body), 1<<30-1, &resp)
	wantTooLarge(t, err)
	if _, err := agentd.ReadChunks(strings.NewReader(body), agentd.MaxOutputAnswer, &resp); err == nil ||
		errors.Is(err, agentd.ErrAnswerTooLarge) || !strings.Contains(err.Error(), "shorter than its length") {
		t.Fatalf("an answer shorter than its length: %v", err)
	}
	huge := head + string(frameHeader(1, 1<<32-1)) + "abc"
	if _, err := agentd.ReadChunks(strings.NewReader(huge), int64(len(huge)), &resp); err == nil || !strings.Contains(err.Error(), "ends inside a frame") {
		t.Fatalf("a frame announcing 4 GiB: %v", err)
	}
}

// TestClientReadsFilesAsTheyArrive proves OpenFile hands the file over
// before agentd finished sending it: the hostile agentd sends the rest
// only once the client has read the first part.
func TestClientReadsFilesAsTheyArrive(t *testing.T) {
	t.Parallel()
	firstRead := make(chan struct{})
	c, _ := hostileAgentd(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		w.Header().Set(agentd.FileHeaderSize, "100")
		io.WriteString(w, "first")
		w.(http.Flusher).Flush()
		select {
		case <-firstRead:
			io.WriteString(w, "-rest")
		case <-time.After(30 * time.Second):
		}
	})
	f, err := c.OpenFile(testCtx(t), "f", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Body.Close()
	if f.Size != 100 || f.Length != 10 {
		t.Fatalf("size %d, length %d", f.Size, f.Length)
	}
	first := make([]byte, 5)
	if _, err := io.ReadFull(f.Body, first); err != nil || string(first) != "first" {
		t.Fatalf("first part %q: %v", first, err)
	}
	close(firstRead)
	rest, err := io.ReadAll(f.Body)
	if err != nil || string(rest) != "-rest" {
		t.Fatalf("rest %q: %v", rest, err)
	}
}
