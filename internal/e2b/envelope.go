package e2b

import (
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"strings"

	"connectrpc.com/connect"
)

// checkEnvelopes refuses, as invalid_argument, a streaming RPC message
// whose envelope the client got wrong: the compressed flag with no
// encoding negotiated, or a flag a client may not send. Connect's own
// handler answers the first as internal, which would make a client's
// mistake read as the console's fault (and an error line in its log at
// the client's will).
func checkEnvelopes(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ct := strings.ToLower(r.Header.Get("Content-Type"))
		var encodingHeader string
		switch {
		case strings.HasPrefix(ct, "application/connect+"):
			encodingHeader = "Connect-Content-Encoding"
		case strings.HasPrefix(ct, "application/grpc"):
			encodingHeader = "Grpc-Encoding"
		default:
			next.ServeHTTP(w, r)
			return
		}
		enc := strings.TrimSpace(r.Header.Get(encodingHeader))
		r.Body = &envelopeChecker{body: r.Body, compressed: enc != "" && enc != "identity"}
		next.ServeHTTP(w, r)
	})
}

// flagCompressed is the envelope flag of a compressed message, the only
// flag a client's message may carry.
const flagCompressed = 0x01

// envelopeChecker passes an enveloped request stream through unchanged,
// reading each 5-byte prefix (flags, length) ahead, and fails the read
// that would hand over a prefix the client may not send.
type envelopeChecker struct {
	body       io.ReadCloser
	compressed bool // an encoding was negotiated

	prefix    [5]byte
	pending   []byte // the part of the current prefix not yet handed over
	remaining int64  // bytes of the current message not yet handed over
	err       error
}

func (e *envelopeChecker) Read(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	if len(e.pending) == 0 && e.remaining == 0 {
		n, err := io.ReadFull(e.body, e.prefix[:])
		if err != nil {
			if n == 0 && errors.Is(err, io.EOF) {
				return 0, io.EOF
			}
			// A cut prefix: hand over what came, Connect reports it.
			e.pending = e.prefix[:n]
			e.err = err
		} else {
			flags := e.prefix[0]
			switch {
			case flags&^flagCompressed != 0:
				e.err = refuse(connect.CodeInvalidArgument, "A request message carries an envelope flag a client may not send.")
				return 0, e.err
			case flags&flagCompressed != 0 && !e.compressed:
				e.err = refuse(connect.CodeInvalidArgument, "A request message is marked compressed, but no content encoding was negotiated.")
				return 0, e.err
			}
			e.pending = e.prefix[:]
			e.remaining = int64(binary.BigEndian.Uint32(e.prefix[1:]))
		}
	}
	if len(e.pending) > 0 {
		n := copy(p, e.pending)
		e.pending = e.pending[n:]
		if len(e.pending) == 0 && e.err != nil {
			return n, e.err
		}
		return n, nil
	}
	if int64(len(p)) > e.remaining {
		p = p[:e.remaining]
	}
	n, err := e.body.Read(p)
	e.remaining -= int64(n)
	if err == io.EOF && e.remaining > 0 {
		// The message was cut short: Connect reports it.
		e.err = err
	} else if err == io.EOF {
		err = nil
	}
	return n, err
}

func (e *envelopeChecker) Close() error { return e.body.Close() }
