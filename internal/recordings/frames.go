// Package recordings keeps what crossed a terminal: the commands run
// through the gateway and, per command, every chunk of output (as agentd
// numbered it) and of input, with its stream and time. Chunks are stored in
// frames (one per write, compressed together) and hash-chained chunk to
// chunk, one chain for output and one for input; the command's end event in
// the audit log carries both chain heads and byte counts, so verifying the
// audit log also proves the recordings.
package recordings

import (
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Chain kinds: output chunks keep agentd's ids; input chunks are numbered
// by the gateway.
const (
	KindOut = "out"
	KindIn  = "in"
)

// Streams of a chunk.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
	StreamPTY    = "pty"
	StreamStdin  = "stdin"
	// StreamGap marks output agentd dropped before it was recorded (its
	// ring overflowed); Data holds the number of bytes lost, in decimal.
	StreamGap = "gap"
	// StreamEOF marks stdin closed by the client (Ctrl-D on a TTY).
	StreamEOF = "eof"
	// StreamTypist opens every stdin frame: Data is its Typist as JSON.
	// It is in the input chain but not in the input's byte counts.
	StreamTypist = "typist"
)

var streamCodes = map[string]byte{StreamStdout: 1, StreamStderr: 2, StreamPTY: 3, StreamStdin: 4, StreamGap: 5, StreamEOF: 6, StreamTypist: 7, StreamExec: 8}
var streamNames = map[byte]string{1: StreamStdout, 2: StreamStderr, 3: StreamPTY, 4: StreamStdin, 5: StreamGap, 6: StreamEOF, 7: StreamTypist, 8: StreamExec}

// Chunk is one piece of recorded terminal traffic.
type Chunk struct {
	Seq    uint64
	Stream string
	At     time.Time
	Data   []byte
}

// ChainStart is the hash a chain starts from.
const ChainStart = ""

// chainHash links c to prev: sha256(prev | seq | stream | time µs | data).
func chainHash(prev string, c Chunk) string {
	h := sha256.New()
	h.Write([]byte(prev))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], c.Seq)
	h.Write(b[:])
	h.Write([]byte{streamCodes[c.Stream]})
	binary.BigEndian.PutUint64(b[:], uint64(c.At.UnixMicro()))
	h.Write(b[:])
	h.Write(c.Data)
	return hex.EncodeToString(h.Sum(nil))
}

// encodeFrame packs chunks (with increasing seq) into a compressed body and
// returns it with the chain head after them and their data size.
func encodeFrame(prev string, chunks []Chunk) (body []byte, head string, raw int, err error) {
	var out bytes.Buffer
	// BestSpeed: terminal output is repetitive, so even the fastest level
	// shrinks it several times, and the follower keeps up with agentd.
	// A flate writer allocates over half a megabyte of tables; at bulk
	// output rates making one per frame cost more than compressing.
	w, _ := flateWriters.Get().(*flate.Writer)
	if w == nil {
		if w, err = flate.NewWriter(&out, flate.BestSpeed); err != nil {
			return nil, "", 0, err
		}
	} else {
		w.Reset(&out)
	}
	defer func() {
		w.Reset(io.Discard) // let go of this frame's buffer
		flateWriters.Put(w)
	}()
	head = prev
	var hdr []byte
	for _, c := range chunks {
		code, ok := streamCodes[c.Stream]
		if !ok {
			return nil, "", 0, fmt.Errorf("recording: unknown stream %q", c.Stream)
		}
		c.At = c.At.UTC().Truncate(time.Microsecond)
		// Each chunk: seq, stream, time (µs), length, data; written
		// straight into the compressor, without an uncompressed copy.
		hdr = binary.AppendUvarint(hdr[:0], c.Seq)
		hdr = append(hdr, code)
		hdr = binary.AppendUvarint(hdr, uint64(c.At.UnixMicro()))
		hdr = binary.AppendUvarint(hdr, uint64(len(c.Data)))
		if _, err := w.Write(hdr); err != nil {
			return nil, "", 0, err
		}
		if _, err := w.Write(c.Data); err != nil {
			return nil, "", 0, err
		}
		raw += len(c.Data)
		head = chainHash(head, c)
	}
	if err := w.Close(); err != nil {
		return nil, "", 0, err
	}
	return out.Bytes(), head, raw, nil
}

// flateWriters keeps compressors between frames (see encodeFrame). It is a
// cache of scratch state, not shared data: every use resets its writer.
var flateWriters sync.Pool

var errCorrupt = errors.New("recording frame is corrupt")

// decodeFrame unpacks a body written by encodeFrame.
func decodeFrame(body []byte) ([]Chunk, error) {
	plain, err := io.ReadAll(flate.NewReader(bytes.NewReader(body)))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	r := bytes.NewReader(plain)
	var out []Chunk
	for r.Len() > 0 {
		seq, err := binary.ReadUvarint(r)
		if err != nil {
			return nil, errCorrupt
		}
		code, err := r.ReadByte()
		if err != nil || streamNames[code] == "" {
			return nil, errCorrupt
		}
		at, err := binary.ReadUvarint(r)
		if err != nil {
			return nil, errCorrupt
		}
		n, err := binary.ReadUvarint(r)
		if err != nil || n > uint64(r.Len()) {
			return nil, errCorrupt
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(r, data); err != nil {
			return nil, errCorrupt
		}
		out = append(out, Chunk{Seq: seq, Stream: streamNames[code], At: time.UnixMicro(int64(at)).UTC(), Data: data})
	}
	return out, nil
}
