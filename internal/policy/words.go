package policy

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"
)

// word is one shell word as far as it is known before the command runs.
type word struct {
	// text is the word with quotes and escapes resolved as the shell
	// would; a part known only at run time reads as a NUL byte, which no
	// shell word can hold.
	text string
	// src is the word as written.
	src string
	// unknown: some part is known only at run time.
	unknown bool
	// split: an unquoted part known only at run time, which word
	// splitting may turn into any number of words.
	split bool
	// glob: an unquoted file name pattern, which expands to file names.
	glob bool
}

// known reports whether the whole word is known before it runs.
func (w word) known() bool { return !w.unknown && !w.glob }

func (w word) arg() arg {
	return arg{text: w.text, src: w.src, unknown: !w.known(), split: w.split || w.glob}
}

// unknownPart stands for what is known only at run time inside word.text.
const unknownPart = "\x00"

// maxBraceWords bounds what one word's brace expansion may produce; a
// bigger expansion (or one past the line's limit) is treated as unknown.
const maxBraceWords = 256

// words resolves a command's words as the shell would before running it:
// brace expansion (bash's `{rm,x}` is two words), then quote removal.
func (w *walker) words(sc *scope, ws []*syntax.Word) []word {
	out := make([]word, 0, len(ws))
	for _, sw := range ws {
		src := sc.slice(sw)
		// Brace expansion rewrites the word it is given: give it a copy,
		// so the line's syntax tree stays as parsed.
		if cp := (&syntax.Word{Parts: slices.Clone(sw.Parts)}); hasBrace(sw) && syntax.SplitBraces(cp) {
			n := 0
			for bw, err := range expand.BracesSeq(nil, cp) {
				w.braceWords++
				if n++; err != nil || n > maxBraceWords || w.braceWords > maxLineBraceWords {
					out = append(out, word{text: unknownPart, src: src, unknown: true, split: true})
					break
				}
				if unquotedEmpty(bw) {
					continue // bash drops it: `{,} rm x` runs rm
				}
				r := resolveWord(bw)
				r.src = src
				out = append(out, r)
			}
			continue
		}
		r := resolveWord(sw)
		r.src = src
		out = append(out, r)
	}
	return out
}

// unquotedEmpty reports whether a word brace expansion made is empty and
// unquoted, which the shell removes.
func unquotedEmpty(w *syntax.Word) bool {
	for _, p := range w.Parts {
		if l, ok := p.(*syntax.Lit); !ok || l.Value != "" {
			return false
		}
	}
	return true
}

func hasBrace(sw *syntax.Word) bool {
	for _, p := range sw.Parts {
		if l, ok := p.(*syntax.Lit); ok && strings.IndexByte(l.Value, '{') >= 0 {
			return true
		}
	}
	return false
}

// resolveWord removes quotes and escapes from one word.
func resolveWord(sw *syntax.Word) word {
	var b strings.Builder
	var r word
	for _, part := range sw.Parts {
		switch p := part.(type) {
		case *syntax.Lit:
			unquoteLit(&b, p.Value, &r)
		case *syntax.SglQuoted:
			if p.Dollar {
				b.WriteString(ansiC(p.Value))
			} else {
				b.WriteString(p.Value)
			}
		case *syntax.DblQuoted:
			for _, q := range p.Parts {
				switch q := q.(type) {
				case *syntax.Lit:
					b.WriteString(unescape(q.Value, "$`\"\\\n"))
				case *syntax.ParamExp:
					// "$@" and "${a[@]}" still become several words.
					r.unknown = true
					if q.Param != nil && (q.Param.Value == "@" || q.Param.Value == "*") || q.Index != nil || q.Names != 0 {
						r.split = true
					}
					b.WriteString(unknownPart)
				default:
					r.unknown = true
					b.WriteString(unknownPart)
				}
			}
		case *syntax.ProcSubst:
			// A /dev/fd path: one word, known only when it runs.
			r.unknown = true
			b.WriteString(unknownPart)
		case *syntax.ExtGlob:
			r.glob = true
			b.WriteString(p.Op.String() + p.Pattern.Value + ")")
		default: // ParamExp, CmdSubst, ArithmExp, BraceExp
			r.unknown, r.split = true, true
			b.WriteString(unknownPart)
		}
	}
	r.text = b.String()
	return r
}

// unquoteLit resolves an unquoted literal: a backslash keeps the next
// character (a backslash-newline joins lines), and an unescaped `*`, `?`
// or `[...]` makes a file name pattern.
func unquoteLit(b *strings.Builder, s string, r *word) {
	if strings.IndexByte(s, '\\') < 0 {
		if strings.ContainsAny(s, "*?") || strings.IndexByte(s, '[') >= 0 && strings.IndexByte(s, ']') > strings.IndexByte(s, '[') {
			r.glob = true
		}
		b.WriteString(s)
		return
	}
	open := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) {
			i++
			if s[i] != '\n' {
				b.WriteByte(s[i])
			}
			continue
		}
		switch c {
		case '*', '?':
			r.glob = true
		case '[':
			open = true
		case ']':
			if open {
				r.glob = true
			}
		}
		b.WriteByte(c)
	}
}

// unescape removes the backslashes before the characters in special (as
// inside double quotes, where only $ ` " \ and newline can be escaped).
func unescape(s, special string) string {
	if strings.IndexByte(s, '\\') < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) && strings.IndexByte(special, s[i+1]) >= 0 {
			i++
			if s[i] == '\n' {
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ansiC decodes bash's $'...' quoting. A NUL ends the string, as in bash.
func ansiC(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch c = s[i]; c {
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'e', 'E':
			b.WriteByte(0x1b)
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		case '\\', '\'', '"', '?':
			b.WriteByte(c)
		case 'c':
			if i+1 < len(s) {
				i++
				b.WriteByte(s[i] & 0x1f)
			} else {
				b.WriteString(`\c`)
			}
		case 'x', 'u', 'U':
			digits := map[byte]int{'x': 2, 'u': 4, 'U': 8}[c]
			j := i + 1
			for j < len(s) && j-i-1 < digits && isHex(s[j]) {
				j++
			}
			if j == i+1 {
				b.WriteByte('\\')
				b.WriteByte(c)
				continue
			}
			n, _ := strconv.ParseUint(s[i+1:j], 16, 32)
			if c == 'x' {
				b.WriteByte(byte(n))
			} else if utf8.ValidRune(rune(n)) {
				b.WriteRune(rune(n))
			}
			i = j - 1
		case '0', '1', '2', '3', '4', '5', '6', '7':
			j := i
			for j < len(s) && j-i < 3 && s[j] >= '0' && s[j] <= '7' {
				j++
			}
			n, _ := strconv.ParseUint(s[i:j], 8, 16)
			b.WriteByte(byte(n))
			i = j - 1
		default:
			b.WriteByte('\\')
			b.WriteByte(c)
		}
	}
	out := b.String()
	if k := strings.IndexByte(out, 0); k >= 0 {
		out = out[:k]
	}
	return out
}

// heredoc is the code a here-document gives its command: with a quoted
// delimiter the body as written, otherwise with its escapes resolved and
// its expansions known only when it runs.
func heredoc(r *syntax.Redirect, sc *scope) word {
	v := word{src: "here-document"}
	if r.Hdoc == nil {
		return v
	}
	v.src = sc.slice(r.Hdoc)
	quoted := false
	for _, p := range r.Word.Parts {
		if l, ok := p.(*syntax.Lit); !ok || strings.IndexByte(l.Value, '\\') >= 0 {
			quoted = true
		}
	}
	var b strings.Builder
	for _, p := range r.Hdoc.Parts {
		l, ok := p.(*syntax.Lit)
		switch {
		case !ok:
			v.unknown = true
			b.WriteString(unknownPart)
		case quoted:
			b.WriteString(l.Value)
		default:
			b.WriteString(unescape(l.Value, "$`\\\n"))
		}
	}
	v.text = b.String()
	return v
}
