package e2b

import (
	"sort"
	"strings"
)

// The metadata list filter must be encoded exactly as the official JS SDK
// (e2b 2.x, SandboxPaginator.nextItems) does, because E2B's server undoes
// exactly that many layers (utils.parseFilters: one QueryUnescape of the
// whole value after the framework's own, a split on & and =, then one
// QueryUnescape per key and value). The SDK:
//  1. encodes every key and value with encodeURIComponent,
//  2. joins them with URLSearchParams(...).toString(), which form-encodes
//     the already-encoded parts once more,
//  3. lets openapi-fetch encode the whole string with encodeURIComponent as
//     the metadata query value.
// Go's url.QueryEscape differs from both JavaScript encoders (in ~ ! * ' (
// ) and space), so the encoders are written out here.

const upperhex = "0123456789ABCDEF"

// escape percent-encodes every byte of s for which keep is false, with
// upper-case hex like JavaScript; space becomes plus when spacePlus.
func escape(s string, keep func(byte) bool, spacePlus bool) string {
	var b strings.Builder
	b.Grow(len(s) * 3)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case keep(c):
			b.WriteByte(c)
		case c == ' ' && spacePlus:
			b.WriteByte('+')
		default:
			b.WriteByte('%')
			b.WriteByte(upperhex[c>>4])
			b.WriteByte(upperhex[c&15])
		}
	}
	return b.String()
}

func alnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// encodeURIComponent is JavaScript's: all but A-Z a-z 0-9 - _ . ! ~ * ' ( )
// is percent-encoded as UTF-8.
func encodeURIComponent(s string) string {
	return escape(s, func(c byte) bool { return alnum(c) || strings.IndexByte("-_.!~*'()", c) >= 0 }, false)
}

// formEncode is the WHATWG application/x-www-form-urlencoded byte
// serializer URLSearchParams uses: A-Z a-z 0-9 * - . _ stay, space becomes
// +, everything else is percent-encoded.
func formEncode(s string) string {
	return escape(s, func(c byte) bool { return alnum(c) || strings.IndexByte("*-._", c) >= 0 }, true)
}

// metadataFilter is the metadata parameter's value before the query
// string's own encoding (steps 1 and 2 above). Keys are sorted so requests
// are reproducible; the server does not care about order.
func metadataFilter(md map[string]string) string {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	pairs := make([]string, len(keys))
	for i, k := range keys {
		pairs[i] = formEncode(encodeURIComponent(k)) + "=" + formEncode(encodeURIComponent(md[k]))
	}
	return strings.Join(pairs, "&")
}

// query builds a query string the way openapi-fetch does: each value
// through encodeURIComponent; arrays (form style, explode false) as
// comma-joined encoded items.
type query []string

func (q *query) add(name, value string) {
	*q = append(*q, name+"="+encodeURIComponent(value))
}

func (q *query) addList(name string, values []string) {
	enc := make([]string, len(values))
	for i, v := range values {
		enc[i] = encodeURIComponent(v)
	}
	*q = append(*q, name+"="+strings.Join(enc, ","))
}

func (q query) String() string { return strings.Join(q, "&") }
