package recordings

import (
	"unicode/utf8"
)

// Stripper removes terminal escapes from output as it streams by: CSI
// sequences (colours, cursor moves), OSC strings (window titles,
// hyperlinks), DCS/SOS/PM/APC strings, two- and three-byte ESC sequences
// and C0 controls other than tab and newline. A carriage return ends a line
// (CR LF becomes one newline; a lone CR, as progress bars print, a newline
// too, so each state a line went through stays readable). A sequence split
// across chunks is removed whole: the Stripper keeps its state between
// writes.
type Stripper struct {
	state  stripState
	lastCR bool
}

type stripState uint8

const (
	sGround    stripState = iota
	sEsc                  // after ESC
	sEscInter             // ESC followed by intermediates (charset designation)
	sCSI                  // ESC [ ... final byte
	sString               // OSC, DCS, SOS, PM, APC: until BEL or ST
	sStringEsc            // ESC inside a string: ST when followed by '\'
)

// Append appends p to dst with escapes removed and returns it.
func (s *Stripper) Append(dst, p []byte) []byte {
	for _, b := range p {
		switch s.state {
		case sGround:
			switch {
			case b == 0x1b:
				s.state = sEsc
			case b == '\r':
				dst = append(dst, '\n')
				s.lastCR = true
				continue
			case b == '\n':
				if !s.lastCR {
					dst = append(dst, '\n')
				}
			case b == '\t' || b >= 0x20 && b != 0x7f:
				dst = append(dst, b)
			}
		case sEsc:
			switch {
			case b == '[':
				s.state = sCSI
			case b == ']' || b == 'P' || b == 'X' || b == '^' || b == '_':
				s.state = sString
			case b >= 0x20 && b <= 0x2f:
				s.state = sEscInter
			case b == 0x1b:
				// ESC ESC: the first one was alone.
			default:
				s.state = sGround
			}
		case sEscInter:
			if b < 0x20 || b > 0x2f {
				s.state = sGround
			}
		case sCSI:
			if b >= 0x40 && b <= 0x7e {
				s.state = sGround
			} else if b == 0x1b {
				s.state = sEsc
			}
		case sString:
			switch b {
			case 0x07:
				s.state = sGround
			case 0x1b:
				s.state = sStringEsc
			}
		case sStringEsc:
			switch b {
			case '\\':
				s.state = sGround
			case 0x1b:
			default:
				s.state = sString
			}
		}
		s.lastCR = false
	}
	return dst
}

// Strip removes terminal escapes from one complete piece of output.
func Strip(p []byte) string {
	var s Stripper
	return string(ValidUTF8(s.Append(nil, p)))
}

// ValidUTF8 replaces each byte of p that is not part of valid UTF-8 with
// '?', in place, keeping every offset (the search index maps offsets to
// moments) and giving databases text they accept.
func ValidUTF8(p []byte) []byte {
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && n <= 1 {
			p[i] = '?'
			n = 1
		}
		i += n
	}
	return p
}

// cutRunes cuts p to at most n bytes without splitting a character.
func cutRunes(p []byte, n int) []byte {
	if len(p) <= n {
		return p
	}
	for i := 0; i < utf8.UTFMax-1 && n > 0 && !utf8.RuneStart(p[n]); i++ {
		n--
	}
	return p[:n]
}
