package audit

import (
	"github.com/gatehouse/gatehouse/internal/clip"
)

// Bounds of the stored text fields, in bytes. The indexed columns
// (actor_id, actor_name, target_id, target_name, action) must stay well
// under Postgres's B-tree entry limit (about 2,700 bytes) whatever a
// caller typed: an e-mail of 4,000 characters must still leave a record
// of the failed sign-in, not an error.
const (
	MaxIndexedText = 512
	MaxUserAgent   = 512
	MaxSourceIP    = 64
)

// Clean makes s storable in any audit column of either database: valid
// UTF-8 (invalid bytes become U+FFFD), no NUL (Postgres text cannot hold
// it) and at most n bytes, cut on a rune boundary and marked with "…".
func Clean(s string, n int) string { return clip.Within(s, n) }

// sanitize bounds and cleans every text field of e before it is hashed
// and stored, so what is verified later is exactly what was written.
// Details are JSON: canonicalJSON already turns invalid UTF-8 into U+FFFD
// and escapes NUL as \u0000.
func sanitize(e Event) Event {
	e.Actor = Actor{Type: Clean(e.Actor.Type, MaxIndexedText), ID: Clean(e.Actor.ID, MaxIndexedText), Name: Clean(e.Actor.Name, MaxIndexedText)}
	e.Target = Target{Type: Clean(e.Target.Type, MaxIndexedText), ID: Clean(e.Target.ID, MaxIndexedText), Name: Clean(e.Target.Name, MaxIndexedText)}
	e.Action = Clean(e.Action, MaxIndexedText)
	e.Decision = Clean(e.Decision, MaxIndexedText)
	e.SourceIP = Clean(e.SourceIP, MaxSourceIP)
	e.UserAgent = Clean(e.UserAgent, MaxUserAgent)
	return e
}
