// Package clip cuts text to a budget without breaking a character, so what
// is stored (Postgres refuses invalid UTF-8) or sent (a WebSocket close
// reason must be UTF-8) stays valid text.
package clip

import (
	"strings"
	"unicode/utf8"
)

// Ellipsis marks text that was cut.
const Ellipsis = "…"

// String returns s with at most n bytes of its text, cut on a character
// boundary and followed by Ellipsis when anything was cut (so the result
// is at most n+3 bytes). Invalid UTF-8 in s becomes U+FFFD first.
func String(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	return s[:boundary(s, n)] + Ellipsis
}

// Runes returns s with at most n characters, followed by Ellipsis when
// anything was cut: for display, where characters, not bytes, are the
// budget.
func Runes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i := 0
	for range n {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return s[:i] + Ellipsis
}

// boundary is the largest index ≤ n at which a character of valid s
// starts.
func boundary(s string, n int) int {
	if n <= 0 {
		return 0
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}
