package policy

import (
	"errors"
	"strings"
	"unicode/utf8"
)

var errBadGlob = errors.New("malformed pattern")

// matchGlob matches s against a shell case pattern: `*` any characters,
// slashes included, `?` one character, `[...]` a class (`[!...]` or
// `[^...]` negated, ranges with `-`), `\` escapes the next character. A
// malformed pattern matches nothing.
func matchGlob(pat, s string) bool {
	// Iterative matching with one backtrack point: linear in practice,
	// never exponential.
	var starP, starS = -1, 0
	p, i := 0, 0
	for i < len(s) {
		if p < len(pat) {
			switch pat[p] {
			case '*':
				starP, starS = p, i
				p++
				continue
			case '?':
				_, n := utf8.DecodeRuneInString(s[i:])
				p++
				i += n
				continue
			case '[':
				r, n := utf8.DecodeRuneInString(s[i:])
				ok, width, valid := matchClass(pat[p:], r)
				if !valid {
					return false
				}
				if ok {
					p += width
					i += n
					continue
				}
			case '\\':
				if p+1 >= len(pat) {
					return false
				}
				r, n := utf8.DecodeRuneInString(pat[p+1:])
				c, m := utf8.DecodeRuneInString(s[i:])
				if r == c {
					p += 1 + n
					i += m
					continue
				}
			default:
				r, n := utf8.DecodeRuneInString(pat[p:])
				c, m := utf8.DecodeRuneInString(s[i:])
				if r == c {
					p += n
					i += m
					continue
				}
			}
		}
		if starP < 0 {
			return false
		}
		_, n := utf8.DecodeRuneInString(s[starS:])
		starS += n
		p, i = starP+1, starS
	}
	for p < len(pat) && pat[p] == '*' {
		p++
	}
	return p == len(pat)
}

// matchClass matches r against the class at the start of pat ("[...]"),
// returning whether it matched, the class's width, and whether the class
// is well formed.
func matchClass(pat string, r rune) (matched bool, width int, valid bool) {
	i := 1
	negate := false
	if i < len(pat) && (pat[i] == '!' || pat[i] == '^') {
		negate = true
		i++
	}
	first := true
	for {
		if i >= len(pat) {
			return false, 0, false
		}
		if pat[i] == ']' && !first {
			return matched != negate, i + 1, true
		}
		first = false
		lo, n, ok := classChar(pat[i:])
		if !ok {
			return false, 0, false
		}
		i += n
		hi := lo
		if i+1 < len(pat) && pat[i] == '-' && pat[i+1] != ']' {
			hi, n, ok = classChar(pat[i+1:])
			if !ok {
				return false, 0, false
			}
			i += 1 + n
		}
		if lo <= r && r <= hi {
			matched = true
		}
	}
}

func classChar(s string) (rune, int, bool) {
	if s[0] == '\\' {
		if len(s) < 2 {
			return 0, 0, false
		}
		r, n := utf8.DecodeRuneInString(s[1:])
		return r, 1 + n, true
	}
	r, n := utf8.DecodeRuneInString(s)
	return r, n, true
}

// checkGlob reports whether pat is a well-formed case pattern.
func checkGlob(pat string) error {
	for i := 0; i < len(pat); i++ {
		switch pat[i] {
		case '\\':
			if i+1 >= len(pat) {
				return errBadGlob
			}
			i++
		case '[':
			_, w, ok := matchClass(pat[i:], 0)
			if !ok {
				return errBadGlob
			}
			i += w - 1
		}
	}
	return nil
}

// MatchWords matches words against a pattern of space-separated words in
// which `*` stands for any number of words, `?` for exactly one, and any
// other word is a shell case pattern over one word (its `*` matches
// slashes too). It takes time proportional to the pattern's length times
// the number of words.
func MatchWords(pattern string, words []string) bool {
	args := make([]arg, len(words))
	for i, w := range words {
		args[i] = arg{text: w}
	}
	return matchArgs(strings.Fields(pattern), args, false)
}

// arg is one argument as the gateway knows it before the command runs.
type arg struct {
	text string
	// src is the argument as written, for explanations.
	src string
	// unknown: known only when it runs (a variable, a substitution, a
	// file name pattern, input read by xargs).
	unknown bool
	// split: an unknown that may become any number of words, not one.
	split bool
}

// matchArgs matches args against pattern words. With could, an unknown
// argument matches whatever it might expand to (the rule may apply); without,
// it matches only where every expansion would (the rule surely applies): a
// `*` absorbs it, and a `?` absorbs one that is a single word.
func matchArgs(pat []string, args []arg, could bool) bool {
	// reach[i]: pattern position i is reachable before args[j].
	reach := make([]bool, len(pat)+1)
	next := make([]bool, len(pat)+1)
	reach[0] = true
	for j := 0; ; j++ {
		// Epsilon moves: `*` may match no words; in could mode an unknown
		// that splits may produce any number of words matching any items.
		splitting := could && j < len(args) && args[j].unknown && args[j].split
		for i := 0; i < len(pat); i++ {
			if reach[i] && (pat[i] == "*" || splitting) {
				reach[i+1] = true
			}
		}
		if j == len(args) {
			return reach[len(pat)]
		}
		a := args[j]
		for i := range next {
			next[i] = false
		}
		alive := false
		for i := 0; i <= len(pat); i++ {
			if !reach[i] {
				continue
			}
			if splitting {
				next[i] = true // it produced its last word, or none
				alive = true
			}
			if i == len(pat) {
				continue
			}
			switch p := pat[i]; {
			case p == "*":
				next[i] = true
				alive = true
			case a.unknown && a.split:
				// Only could mode, handled above.
			case a.unknown:
				if could || p == "?" {
					next[i+1] = true
					alive = true
				}
			case p == "?" || matchGlob(p, a.text):
				next[i+1] = true
				alive = true
			}
		}
		if !alive {
			return false
		}
		reach, next = next, reach
	}
}
