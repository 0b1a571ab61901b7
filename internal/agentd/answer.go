package agentd

import (
	"fmt"
	"io"
)

// Caps on what the Client reads of one answer. Whoever controls an
// environment (root in a sandbox can replace agentd) controls its answers,
// so the Client never reads, and never allocates, more than an honest
// agentd could send: beyond a cap it stops with CodeAnswerTooLarge.
const (
	// MaxControlAnswer bounds a JSON answer that carries no output
	// (health, stat, fetch). The largest honest one is a stat of 1024
	// paths, whose names fit the 1 MiB request body and may grow up to
	// six times when escaped as JSON strings.
	MaxControlAnswer = 8 << 20
	// MaxOutputAnswer bounds an answer that carries output (create with
	// wait_ms, poll, kill), in JSON or in ChunksMediaType. agentd puts at
	// most --poll-bytes (default 1 MiB) of chunk data in one answer, or a
	// single chunk of at most 256 KiB (readBufMax) when the first alone is
	// larger; JSON adds a third for base64 and about 50 bytes per chunk,
	// and a default ring holds at most 32768 chunks (4 MiB at 128 bytes of
	// overhead each): under 4 MiB at the defaults. The rest is headroom
	// for an agentd run with a larger --poll-bytes (up to 8 MiB).
	MaxOutputAnswer = 16 << 20
	// maxErrorAnswer bounds an error body: agentd's error envelope holds
	// one sentence.
	maxErrorAnswer = 64 << 10
	// maxDrain bounds what is read of an answer whose body is not wanted,
	// to let its connection be reused; a longer body closes it instead.
	maxDrain = 64 << 10
	// eagerAlloc is the most ReadChunks allocates up front from a
	// Content-Length: the declared length of an answer is agentd's word,
	// so beyond this the buffer grows only as bytes actually arrive.
	eagerAlloc = 2 << 20
)

// answerTooLarge is the error of an answer over limit bytes.
func answerTooLarge(what string, limit int64) *Error {
	return newError(CodeAnswerTooLarge, "The environment's answer was too large: its %s exceeds the %s the console reads.", what, byteSize(limit))
}

// byteSize writes n as people read it (caps are whole KiB or MiB).
func byteSize(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}

// cappedReader reads r up to n bytes and fails with CodeAnswerTooLarge as
// soon as r holds more, instead of ending silently like io.LimitReader
// (a cut JSON answer would otherwise look like a malformed one, and a cut
// file like a shorter file).
type cappedReader struct {
	r     io.Reader
	n     int64 // bytes left before the limit
	limit int64
	what  string
}

// capReader returns r capped at n bytes; what names the answer in the
// error ("body", "file").
func capReader(r io.Reader, n int64, what string) *cappedReader {
	return &cappedReader{r: r, n: n, limit: n, what: what}
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.n <= 0 {
		// At the cap: one more byte tells the end of the answer from
		// an answer that goes on.
		var one [1]byte
		n, err := c.r.Read(one[:])
		if n > 0 {
			return 0, answerTooLarge(c.what, c.limit)
		}
		return 0, err
	}
	if int64(len(p)) > c.n {
		p = p[:c.n]
	}
	n, err := c.r.Read(p)
	c.n -= int64(n)
	return n, err
}

// readCapped reads all of r into one buffer, failing with
// CodeAnswerTooLarge beyond limit bytes. declared is the length the answer
// announced (-1: none): an announcement over limit fails before anything is
// read, and the buffer is allocated from it only up to eagerAlloc, then
// grows as the bytes arrive, so an answer that announces much and sends
// little costs little.
func readCapped(r io.Reader, declared, limit int64, what string) ([]byte, error) {
	if declared > limit {
		return nil, answerTooLarge(what, limit)
	}
	size := int64(512)
	if declared >= 0 {
		size = min(declared, eagerAlloc)
	}
	buf := make([]byte, 0, size)
	cr := capReader(r, limit, what)
	for {
		if len(buf) == cap(buf) {
			// Grow by doubling, never past the cap (plus the byte that
			// tells an answer at the cap from a longer one).
			grown := make([]byte, len(buf), min(max(2*int64(cap(buf)), 512), limit+1))
			copy(grown, buf)
			buf = grown
		}
		n, err := cr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}
