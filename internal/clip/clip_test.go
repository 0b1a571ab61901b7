package clip_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gatehouse/gatehouse/internal/clip"
)

func TestString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   string
		n    int
		want string
	}{
		{"short", "abc", 5, "abc"},
		{"exact", "abcde", 5, "abcde"},
		{"ascii cut", "abcdef", 5, "abcde…"},
		{"cut inside a two-byte character", "aé", 2, "a…"},
		{"cut after a two-byte character", "aéb", 3, "aé…"},
		{"cut inside a four-byte character", "ab🙂c", 4, "ab…"},
		{"cut inside a three-byte character", "日本語", 4, "日…"},
		{"zero", "abc", 0, "…"},
		{"invalid bytes become U+FFFD", "a\xffb", 10, "a\uFFFDb"},
		{"invalid bytes then cut", "a\xff\xfeb", 4, "a\uFFFD…"},
		{"NUL becomes U+FFFD", "404 Not\x00Found", 40, "404 Not\uFFFDFound"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := clip.String(tc.in, tc.n)
			if got != tc.want {
				t.Errorf("String(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
			}
			if !utf8.ValidString(got) {
				t.Errorf("String(%q, %d) = %q is not valid UTF-8", tc.in, tc.n, got)
			}
			if len(got) > tc.n+len(clip.Ellipsis) && len(got) > len(tc.in) {
				t.Errorf("String(%q, %d) is %d bytes", tc.in, tc.n, len(got))
			}
		})
	}
}

func TestRunes(t *testing.T) {
	t.Parallel()
	if got := clip.Runes("日本語テキスト", 3); got != "日本語…" {
		t.Errorf("Runes = %q", got)
	}
	if got := clip.Runes("abc", 3); got != "abc" {
		t.Errorf("Runes = %q", got)
	}
}

// FuzzString holds the contract for any input: valid UTF-8, a prefix of
// the valid text, within the budget.
func FuzzString(f *testing.F) {
	f.Add("aé日🙂\xff", 3)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		got := clip.String(s, n)
		valid := strings.ToValidUTF8(s, "\uFFFD")
		if !utf8.ValidString(got) {
			t.Fatalf("String(%q, %d) = %q: invalid UTF-8", s, n, got)
		}
		body := strings.TrimSuffix(got, clip.Ellipsis)
		if got == valid {
			return
		}
		if !strings.HasPrefix(valid, body) || len(body) > n {
			t.Fatalf("String(%q, %d) = %q", s, n, got)
		}
	})
}

func TestWithin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abcdefgh", 5, "ab…"},
		{"日本語テキスト", 8, "日…"},
		{"a\x00b", 5, "a\uFFFDb"},
		{"a\x00bc", 5, "a…"},
		{"a\x00", 5, "a\uFFFD"},
	} {
		got := clip.Within(tc.in, tc.n)
		if got != tc.want || len(got) > tc.n || !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 {
			t.Errorf("Within(%q, %d) = %q (%d bytes), want %q", tc.in, tc.n, got, len(got), tc.want)
		}
	}
}
