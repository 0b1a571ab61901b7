package recordings

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gatehouse/gatehouse/internal/clip"
	"gorm.io/gorm"
)

// How many frames one query reads: a long recording is streamed a page at
// a time, never held whole in memory. The first page is small (a poll
// usually needs a frame or two, and a frame holds up to a megabyte); each
// next one doubles up to framePage.
const (
	firstFramePage = 16
	framePage      = 64
)

// errStop ends a Walk early without an error.
var errStop = errors.New("stop")

// frameError is a stored frame that cannot be decoded; it wraps
// errCorrupt.
type frameError struct {
	commandID, firstSeq int64
	err                 error
}

func (e *frameError) Error() string {
	return fmt.Sprintf("command %d frame %d: %v", e.commandID, e.firstSeq, e.err)
}

func (e *frameError) Unwrap() error { return e.err }

// eachFrame calls fn with each stored frame of kind of command id whose
// last_seq is above after (math.MinInt64: every frame), in first_seq
// order, with the frame's chunks decoded (all of them: the first may hold
// some at or below after). It pages by first_seq (keyset, never OFFSET),
// firstFramePage frames at first and up to framePage, so only one page is
// held at a time. fn returning errStop ends the walk without an error; a
// frame that cannot be decoded ends it with a *frameError.
func eachFrame(ctx context.Context, db *gorm.DB, id int64, kind string, after int64, fn func(frame, []Chunk) error) error {
	from := int64(math.MinInt64) // first_seq of the last frame read
	seek := after != math.MinInt64
	for page := firstFramePage; ; page = min(2*page, framePage) {
		var frames []frame
		q := db.WithContext(ctx).Where("command_id = ? AND kind = ? AND last_seq > ? AND first_seq > ?", id, kind, after, from)
		if seek {
			// No index covers last_seq: alone it would filter every
			// earlier frame of the command (each poll near the end of
			// a long recording). Frames never overlap (each starts
			// after the one before ends), so none starting before the
			// last one starting at or below after can end above it:
			// start there, by the primary key.
			q = q.Where("first_seq >= COALESCE((SELECT MAX(first_seq) FROM recording_frames WHERE command_id = ? AND kind = ? AND first_seq <= ?), ?)",
				id, kind, after, int64(math.MinInt64))
			seek = false
		}
		if err := q.Order("first_seq").Limit(page).Find(&frames).Error; err != nil {
			return fmt.Errorf("read recording of command %d: %w", id, err)
		}
		for _, f := range frames {
			cs, err := decodeFrame(f.Body)
			if err != nil {
				return &frameError{commandID: id, firstSeq: f.FirstSeq, err: err}
			}
			if err := fn(f, cs); err != nil {
				if errors.Is(err, errStop) {
					return nil
				}
				return err
			}
			from = f.FirstSeq
		}
		if len(frames) < page {
			return nil
		}
	}
}

// Walk calls fn with each recorded chunk of kind of command id, in order,
// reading the frames a page at a time. fn returning errStop ends the walk
// early; a frame that cannot be decoded ends it with an error wrapping
// errCorrupt.
func Walk(ctx context.Context, db *gorm.DB, id int64, kind string, fn func(Chunk) error) error {
	return eachFrame(ctx, db, id, kind, math.MinInt64, func(_ frame, cs []Chunk) error {
		for _, c := range cs {
			if err := fn(c); err != nil {
				return err
			}
		}
		return nil
	})
}

// Resize is a window size change of a command, from its audit events.
type Resize struct {
	At         time.Time
	Cols, Rows int
}

// castHeader is the first line of an asciicast v2 file.
type castHeader struct {
	Version   int      `json:"version"`
	Width     int      `json:"width"`
	Height    int      `json:"height"`
	Timestamp int64    `json:"timestamp"`
	Duration  *float64 `json:"duration,omitempty"`
	Title     string   `json:"title,omitempty"`
}

// Default window size of a recording whose size was never set.
const (
	DefaultCols = 80
	DefaultRows = 24
)

// CastOptions shape a cast.
type CastOptions struct {
	// Resizes are the command's window changes, oldest first.
	Resizes []Resize
	// CRLF writes each bare newline as CR LF, as a terminal would have
	// shown it: for the player, when the command had no TTY. The output
	// then no longer equals the recording byte for byte.
	CRLF bool
	// Typists are where the typist changes (TypistChanges), oldest first:
	// each becomes an "m" (marker) event naming who types from there.
	Typists []TypistChange
}

// TypistMarker is the label of the marker where typist t begins to type.
func TypistMarker(t Typist) string { return "typist: " + t.Label() }

// WriteCast writes command c's output as asciicast v2
// (https://docs.asciinema.org/manual/asciicast/v2/): a header line, then
// one [seconds, "o", text] event per chunk, seconds counted from the
// command's start and never decreasing. The window starts at the first of
// resizes (80x24 without one); later ones become "r" events. Output agentd
// dropped becomes an "m" (marker) event naming the bytes lost. Typed input
// is not included: what a terminal echoes is in the output already, and
// what it does not echo (passwords at a prompt) stays out of downloads.
// A character split across chunks is sent whole with the later chunk, so
// the "o" events concatenated equal the recorded output (bytes that are not
// UTF-8 at all become U+FFFD, as JSON strings must be text).
func WriteCast(ctx context.Context, db *gorm.DB, w io.Writer, c Command, opts CastOptions) error {
	resizes := opts.Resizes
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	hdr := castHeader{Version: 2, Width: DefaultCols, Height: DefaultRows, Timestamp: c.StartedAt.Unix(), Title: clip.String(c.Command, 200)}
	if len(resizes) > 0 {
		hdr.Width, hdr.Height, resizes = resizes[0].Cols, resizes[0].Rows, resizes[1:]
	}
	if c.EndedAt != nil {
		d := roundMicro(max(c.EndedAt.Sub(c.StartedAt).Seconds(), 0))
		hdr.Duration = &d
	}
	if err := enc.Encode(hdr); err != nil {
		return fmt.Errorf("write cast header: %w", err)
	}
	last := 0.0
	emit := func(at time.Time, code, data string) error {
		last = max(last, roundMicro(at.Sub(c.StartedAt).Seconds()))
		return enc.Encode([]any{last, code, data})
	}
	var j runeJoiner
	eol := crlf{on: opts.CRLF}
	typists := opts.Typists
	// marks writes the window changes and typist changes at or before at.
	marks := func(at time.Time) error {
		for len(resizes) > 0 && !resizes[0].At.After(at) || len(typists) > 0 && !typists[0].At.After(at) {
			if len(typists) == 0 || len(resizes) > 0 && !resizes[0].At.After(typists[0].At) {
				if err := emit(resizes[0].At, "r", strconv.Itoa(resizes[0].Cols)+"x"+strconv.Itoa(resizes[0].Rows)); err != nil {
					return err
				}
				resizes = resizes[1:]
				continue
			}
			if err := emit(typists[0].At, "m", TypistMarker(typists[0].Typist)); err != nil {
				return err
			}
			typists = typists[1:]
		}
		return nil
	}
	err := Walk(ctx, db, c.ID, KindOut, func(ch Chunk) error {
		if err := marks(ch.At); err != nil {
			return err
		}
		if ch.Stream == StreamGap {
			return emit(ch.At, "m", "gatehouse: "+string(ch.Data)+" bytes of output were lost here (agentd's buffer overflowed)")
		}
		if ch.Stream == StreamExec {
			return nil // the terminal never showed it; the .json export has it
		}
		if p := j.next(ch.Data); len(p) > 0 {
			return emit(ch.At, "o", eol.convert(p))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if p := j.rest(); len(p) > 0 {
		if err := enc.Encode([]any{last, "o", eol.convert(p)}); err != nil {
			return err
		}
	}
	// Typing after the last output (an exit typed at the end); window
	// changes after it show nothing.
	resizes = nil
	if err := marks(time.Unix(1<<40, 0)); err != nil {
		return err
	}
	return bw.Flush()
}

// WriteText writes command c's output with terminal escapes removed: what
// a person reads, for grep and for pasting into a report. Bytes that are
// not UTF-8 become '?'.
func WriteText(ctx context.Context, db *gorm.DB, w io.Writer, c Command) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	var s Stripper
	var j runeJoiner
	var buf []byte
	err := Walk(ctx, db, c.ID, KindOut, func(ch Chunk) error {
		if ch.Stream == StreamGap || ch.Stream == StreamExec {
			return nil
		}
		buf = s.Append(buf[:0], ch.Data)
		_, err := bw.Write(ValidUTF8(j.next(buf)))
		return err
	})
	if err != nil {
		return err
	}
	if _, err := bw.Write(ValidUTF8(j.rest())); err != nil {
		return err
	}
	return bw.Flush()
}

// crlf turns bare newlines into CR LF when on, across pieces.
type crlf struct {
	on     bool
	lastCR bool
}

func (e *crlf) convert(p []byte) string {
	if !e.on {
		return string(p)
	}
	var b strings.Builder
	b.Grow(len(p) + len(p)/16)
	for _, c := range p {
		if c == '\n' && !e.lastCR {
			b.WriteByte('\r')
		}
		b.WriteByte(c)
		e.lastCR = c == '\r'
	}
	return b.String()
}

func roundMicro(s float64) float64 { return math.Round(s*1e6) / 1e6 }

// runeJoiner passes bytes on in pieces that never end inside a UTF-8
// character: an incomplete one at the end of a piece waits for the next.
type runeJoiner struct {
	carry []byte
	out   []byte
}

// next returns the complete characters of what was carried plus p; the
// result is valid until the next call.
func (j *runeJoiner) next(p []byte) []byte {
	j.out = append(append(j.out[:0], j.carry...), p...)
	n := completeUTF8(j.out)
	j.carry = append(j.carry[:0], j.out[n:]...)
	return j.out[:n]
}

// rest returns what is still carried (an incomplete character at the end).
func (j *runeJoiner) rest() []byte {
	r := j.carry
	j.carry = nil
	return r
}

// completeUTF8 is the length of p without an incomplete character at its
// end.
func completeUTF8(p []byte) int {
	for i := len(p) - 1; i >= 0 && i >= len(p)-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			if !utf8.FullRune(p[i:]) {
				return i
			}
			break
		}
	}
	return len(p)
}
