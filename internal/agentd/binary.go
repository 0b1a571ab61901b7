package agentd

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
)

// ChunksMediaType is the binary alternative to the JSON poll response that
// a client may ask for with an Accept header. It carries the same fields
// without base64 and JSON string scanning, which dominate the cost of
// moving bulk output:
//
//	header line: the SessionResponse as JSON with "chunks":[] and a '\n'
//	then per chunk: id (8 bytes, big endian), stream (1 byte: 0 stdout,
//	1 stderr, 2 pty, 3 exec, 4 net), length (4 bytes, big endian), data
//
// Stream 3 appears only in sessions whose create asked for exec records
// (HeaderExecRecords), stream 4 only in sessions whose create carried a
// network policy, so a client that does not know them never meets them.
const ChunksMediaType = "application/x-agentd-chunks"

const frameHeaderLen = 8 + 1 + 4

// WantsChunks reports whether the request accepts ChunksMediaType. The
// console's gateway answers its output polls in the same form.
func WantsChunks(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for len(v) > 0 {
			var part string
			part, v, _ = cut(v, ',')
			mt, params, err := mime.ParseMediaType(part)
			if err != nil || mt != ChunksMediaType {
				continue
			}
			// q=0 means "not acceptable".
			if q, err := strconv.ParseFloat(params["q"], 64); err == nil && q <= 0 {
				continue
			}
			return true
		}
	}
	return false
}

func cut(s string, sep byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func streamNumber(name string) uint8 {
	switch name {
	case StreamStderr:
		return streamStderr
	case StreamPTY:
		return streamPTY
	case StreamExec:
		return streamExec
	case StreamNet:
		return streamNet
	default:
		return streamStdout
	}
}

// writeBinary answers a poll in ChunksMediaType.
func writeBinary(w http.ResponseWriter, resp SessionResponse) {
	chunks := resp.Chunks
	resp.Chunks = []Chunk{}
	if err := WriteChunks(w, resp, chunks); err != nil {
		writeError(w, err)
	}
}

// WriteChunks answers 200 in ChunksMediaType: head (whose own chunk list
// the caller left empty) as the JSON header line, then chunks as frames.
// It returns an error only when head cannot be encoded, before anything
// was written.
func WriteChunks(w http.ResponseWriter, head any, chunks []Chunk) error {
	line, err := json.Marshal(head)
	if err != nil {
		return fmt.Errorf("agentd: encode chunks header: %w", err)
	}
	line = append(line, '\n')
	size := len(line)
	for _, c := range chunks {
		size += frameHeaderLen + len(c.Data)
	}
	h := w.Header()
	h.Set("Content-Type", ChunksMediaType)
	h.Set("Content-Length", strconv.Itoa(size))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(line); err != nil {
		return nil
	}
	var frame [frameHeaderLen]byte
	for _, c := range chunks {
		binary.BigEndian.PutUint64(frame[0:8], c.ID)
		frame[8] = streamNumber(c.Stream)
		binary.BigEndian.PutUint32(frame[9:13], uint32(len(c.Data)))
		if _, err := w.Write(frame[:]); err != nil {
			return nil
		}
		if _, err := w.Write(c.Data); err != nil {
			return nil
		}
	}
	return nil
}

// readBinary decodes a ChunksMediaType poll answer.
func readBinary(body io.Reader, contentLength int64) (*SessionResponse, error) {
	var resp SessionResponse
	chunks, err := ReadChunks(body, contentLength, &resp)
	if err != nil {
		return nil, err
	}
	resp.Chunks = chunks
	return &resp, nil
}

// ReadChunks decodes a ChunksMediaType body: its header line into head and
// its frames as the returned chunks. All chunk data shares one allocation.
// A body over MaxOutputAnswer fails with CodeAnswerTooLarge (*Error), as
// soon as its Content-Length says so or its bytes go past the cap; a
// frame's length prefix is checked against the bytes that arrived, so
// neither allocates more than what was actually sent.
func ReadChunks(body io.Reader, contentLength int64, head any) ([]Chunk, error) {
	if contentLength > MaxOutputAnswer {
		return nil, answerTooLarge("binary output answer", MaxOutputAnswer)
	}
	br := bufio.NewReaderSize(body, 64<<10)
	line, err := br.ReadSlice('\n')
	if err != nil {
		return nil, fmt.Errorf("agentd: binary response header: %w", err)
	}
	if err := json.Unmarshal(line, head); err != nil {
		return nil, fmt.Errorf("agentd: binary response header: %w", err)
	}
	declared, frames := int64(-1), io.Reader(br)
	if contentLength >= 0 {
		if declared = contentLength - int64(len(line)); declared < 0 {
			return nil, errors.New("agentd: binary response has a bad length")
		}
		frames = io.LimitReader(br, declared)
	}
	rest, err := readCapped(frames, declared, MaxOutputAnswer-int64(len(line)), "binary output answer")
	if err != nil {
		var ae *Error
		if errors.As(err, &ae) {
			return nil, err
		}
		return nil, fmt.Errorf("agentd: binary response: %w", err)
	}
	if declared >= 0 && int64(len(rest)) != declared {
		return nil, errors.New("agentd: binary response is shorter than its length")
	}
	chunks := []Chunk{}
	for len(rest) > 0 {
		if len(rest) < frameHeaderLen {
			return nil, errors.New("agentd: binary response ends inside a frame")
		}
		id := binary.BigEndian.Uint64(rest[0:8])
		stream := streamName(rest[8])
		n := int(binary.BigEndian.Uint32(rest[9:13]))
		rest = rest[frameHeaderLen:]
		if n > len(rest) {
			return nil, errors.New("agentd: binary response ends inside a frame")
		}
		chunks = append(chunks, Chunk{ID: id, Stream: stream, Data: rest[:n:n]})
		rest = rest[n:]
	}
	return chunks, nil
}
