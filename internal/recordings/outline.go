package recordings

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"unicode/utf8"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// TypedLine is a command line typed into an interactive shell, as the
// shell's OSC 133 marks delimit it: the text between the end of a prompt
// (B) and the start of the command (C).
type TypedLine struct {
	// At is how far into the recording the prompt ended, in seconds:
	// where a replay jumps to show the line being typed.
	At       float64
	Text     string
	ExitCode *int // from the D mark, when the shell sent one
}

// Program is a program the kernel saw start in the command (an exec
// record of a direct child of its shell).
type Program struct {
	At       float64
	Line     string // "$ argv..."
	ExitCode *int
}

// Outline is what a replay lists beside the player.
type Outline struct {
	// Lines are the typed command lines (none without the shell
	// integration, or after the user switched it off).
	Lines []TypedLine
	// Programs are the first OutlinePrograms programs the shell started
	// directly; ProgramsTotal counts every exec record (all depths).
	Programs      []Program
	ProgramsTotal int
}

// Bounds of an outline, so a replay page stays small whatever ran.
const (
	OutlineLines    = 1000
	OutlinePrograms = 500
	typedLineMax    = 1024
)

// ReadOutline walks command c's recorded output once for its outline.
func ReadOutline(ctx context.Context, db *gorm.DB, c Command) (Outline, error) {
	var o Outline
	var sc markScanner
	byPID := map[int]int{}
	err := Walk(ctx, db, c.ID, KindOut, func(ch Chunk) error {
		at := max(ch.At.Sub(c.StartedAt).Seconds(), 0)
		switch ch.Stream {
		case StreamExec:
			recs, _ := agentd.ParseExecRecords(ch.Data)
			for _, r := range recs {
				switch {
				case r.Type == agentd.ExecRecordExec:
					o.ProgramsTotal++
					if r.ShellChild && r.First && len(o.Programs) < OutlinePrograms {
						pat := at
						if !r.Time.IsZero() {
							pat = max(r.Time.Sub(c.StartedAt).Seconds(), 0)
						}
						byPID[r.PID] = len(o.Programs)
						o.Programs = append(o.Programs, Program{At: pat, Line: agentd.ExecLine(r)})
					}
				case r.Type == agentd.ExecRecordExit:
					if i, ok := byPID[r.PID]; ok {
						o.Programs[i].ExitCode = r.ExitCode
						delete(byPID, r.PID)
					}
				}
			}
		case StreamGap:
		default:
			sc.scan(ch.Data, at, &o)
		}
		return nil
	})
	return o, err
}

// markScanner finds OSC 133 marks in terminal output as it streams by
// (a mark may be split across chunks) and collects what was echoed
// between B and C.
type markScanner struct {
	esc     bool   // the last byte was ESC outside an OSC
	inOSC   bool   // inside ESC ] ... (BEL or ESC \)
	oscEsc  bool   // ESC seen inside the OSC
	osc     []byte // the OSC's text, bounded
	typing  bool   // between B and C
	typedAt float64
	typed   []byte
	ran     bool // a C was seen since the last D
}

func (m *markScanner) scan(p []byte, at float64, o *Outline) {
	for _, b := range p {
		switch {
		case m.inOSC:
			switch {
			case b == 0x07 || (m.oscEsc && b == '\\'):
				m.inOSC, m.oscEsc = false, false
				m.mark(at, o)
			case b == 0x1b:
				m.oscEsc = true
			default:
				m.oscEsc = false
				if len(m.osc) < 64 {
					m.osc = append(m.osc, b)
				}
			}
		case m.esc:
			m.esc = false
			if b == ']' {
				m.inOSC, m.osc = true, m.osc[:0]
				continue
			}
			m.keep(0x1b)
			m.keep(b)
		case b == 0x1b:
			m.esc = true
		default:
			m.keep(b)
		}
	}
}

// keep collects a byte echoed while a line is being typed.
func (m *markScanner) keep(b byte) {
	if m.typing && len(m.typed) < 4*typedLineMax {
		m.typed = append(m.typed, b)
	}
}

func (m *markScanner) mark(at float64, o *Outline) {
	rest, ok := bytes.CutPrefix(m.osc, []byte("133;"))
	if !ok || len(rest) == 0 {
		return
	}
	switch rest[0] {
	case 'A':
		m.typing = false
	case 'B':
		m.typing, m.typedAt, m.typed = true, at, m.typed[:0]
	case 'C':
		if m.typing && len(o.Lines) < OutlineLines {
			if text := typedText(m.typed); text != "" {
				o.Lines = append(o.Lines, TypedLine{At: m.typedAt, Text: text})
				m.ran = true
			}
		}
		m.typing = false
	case 'D':
		if m.ran && len(o.Lines) > 0 {
			if _, v, ok := strings.Cut(string(rest), ";"); ok {
				if code, err := strconv.Atoi(v); err == nil {
					o.Lines[len(o.Lines)-1].ExitCode = &code
				}
			}
		}
		m.ran = false
	}
}

// typedText is what a terminal showed of an echoed line: escapes removed,
// backspaces applied, the last non-empty line of it (a line editor that
// redraws starts over on a new line), trimmed and bounded.
func typedText(echo []byte) string {
	var line []rune
	last := ""
	text := ValidUTF8(stripKeepBackspace(echo))
	for len(text) > 0 {
		r, n := utf8.DecodeRune(text)
		text = text[n:]
		switch r {
		case '\b':
			if len(line) > 0 {
				line = line[:len(line)-1]
			}
		case '\n':
			if t := strings.TrimSpace(string(line)); t != "" {
				last = t
			}
			line = line[:0]
		default:
			line = append(line, r)
		}
	}
	if t := strings.TrimSpace(string(line)); t != "" {
		last = t
	}
	return string(cutRunes([]byte(last), typedLineMax))
}

// stripKeepBackspace removes escapes like Stripper but keeps backspaces,
// which a line editor sends to erase.
func stripKeepBackspace(p []byte) []byte {
	var s Stripper
	var out []byte
	start := 0
	for i, b := range p {
		if b == '\b' {
			out = s.Append(out, p[start:i])
			if s.state == sGround {
				out = append(out, '\b')
			}
			start = i + 1
		}
	}
	return s.Append(out, p[start:])
}

// Seconds formats an outline moment for a replay URL (?t=).
func Seconds(at float64) string { return strconv.FormatFloat(at, 'f', 3, 64) }
