// Package clip cuts text to a budget without breaking a character, so what
// is stored (Postgres text refuses invalid UTF-8 and NUL) or sent (a
// WebSocket close reason must be UTF-8) stays valid text.
package clip

import (
	"strings"
	"unicode/utf8"
)

// Ellipsis marks text that was cut.
const Ellipsis = "…"

// String returns s with at most n bytes of its text, cut on a character
// boundary and followed by Ellipsis when anything was cut (so the result
// is at most n+3 bytes). Invalid UTF-8 and NUL in s become U+FFFD first.
func String(s string, n int) string {
	s = Storable(s)
	if len(s) <= n {
		return s
	}
	return s[:boundary(s, n)] + Ellipsis
}

// Within is String with the Ellipsis inside the budget: at most n bytes
// in all (n ≥ len(Ellipsis)).
func Within(s string, n int) string {
	s = Storable(s)
	if len(s) <= n {
		return s
	}
	return s[:boundary(s, n-len(Ellipsis))] + Ellipsis
}

// Storable is s as any text column of either database holds it: invalid
// UTF-8 and NUL bytes become U+FFFD.
func Storable(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	return s
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
