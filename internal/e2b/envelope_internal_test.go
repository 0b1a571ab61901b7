package e2b

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/gatehouse/gatehouse/internal/e2b/gen/process/processconnect"
)

// envelope frames msg as a Connect streaming message with flags.
func envelope(flags byte, msg string) []byte {
	b := []byte{flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// syncBuffer is a log sink the handler's goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestMalformedEnvelopeIsInvalidArgument: a streaming message marked
// compressed with no encoding negotiated, or carrying a flag a client may
// not send, is the client's mistake: answered invalid_argument and logged
// at debug, never internal nor an error line in the console's log.
func TestMalformedEnvelopeIsInvalidArgument(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, encoding string
		flags          byte
	}{
		{"compressed without an encoding", "", 0x01},
		{"compressed with identity", "identity", 0x01},
		{"end-stream flag from a client", "", 0x02},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			logs := &syncBuffer{}
			s := &Server{
				Resolver: ResolverFunc(func(context.Context, string, string) (Binding, error) { return Binding{SessionID: 1}, nil }),
				Logger:   slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			}
			srv := httptest.NewServer(s.Handler())
			t.Cleanup(srv.Close)
			req, err := http.NewRequest(http.MethodPost, srv.URL+processconnect.ProcessStartProcedure, bytes.NewReader(envelope(tc.flags, `{}`)))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/connect+json")
			req.Header.Set(SandboxHeader, "sbx")
			if tc.encoding != "" {
				req.Header.Set("Connect-Content-Encoding", tc.encoding)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if code := endStreamCode(t, body); code != "invalid_argument" {
				t.Errorf("answered %q (%s), want invalid_argument", code, body)
			}
			if l := logs.String(); strings.Contains(l, "level=ERROR") || !strings.Contains(l, "level=DEBUG") {
				t.Errorf("logged at the wrong level, want one debug line:\n%s", l)
			}
		})
	}
}

// endStreamCode reads the error code of a Connect stream's end message.
func endStreamCode(t *testing.T, body []byte) string {
	t.Helper()
	for len(body) >= 5 {
		n := binary.BigEndian.Uint32(body[1:5])
		if int(n) > len(body)-5 {
			break
		}
		if body[0]&0x02 != 0 {
			var end struct {
				Error struct{ Code string } `json:"error"`
			}
			if err := json.Unmarshal(body[5:5+n], &end); err != nil {
				t.Fatalf("end of stream %s: %v", body[5:5+n], err)
			}
			return end.Error.Code
		}
		body = body[5+n:]
	}
	t.Fatalf("no end-of-stream message in %q", body)
	return ""
}

// TestEnvelopeCheckerPassesStreamsThrough: well-formed streams (plain,
// compressed with an encoding, empty messages) read back byte for byte,
// however the reads are split; a cut stream reads back as cut, for
// Connect to report.
func TestEnvelopeCheckerPassesStreamsThrough(t *testing.T) {
	t.Parallel()
	stream := bytes.Join([][]byte{envelope(0, `{"a":1}`), envelope(0, ``), envelope(0x01, "zipped"), envelope(0, strings.Repeat("x", 5000))}, nil)
	for _, split := range []func(io.Reader) io.Reader{
		func(r io.Reader) io.Reader { return r },
		iotest.OneByteReader,
		iotest.HalfReader,
	} {
		got, err := io.ReadAll(split(&envelopeChecker{body: io.NopCloser(bytes.NewReader(stream)), compressed: true}))
		if err != nil || !bytes.Equal(got, stream) {
			t.Fatalf("read back %d bytes (%v), want the %d sent", len(got), err, len(stream))
		}
	}
	cut := stream[:len(stream)-10]
	if got, err := io.ReadAll(&envelopeChecker{body: io.NopCloser(bytes.NewReader(cut)), compressed: true}); err != nil || !bytes.Equal(got, cut) {
		t.Fatalf("a cut stream read back %d bytes (%v), want the %d sent", len(got), err, len(cut))
	}
}
