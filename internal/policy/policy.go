package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
)

// Action is what a rule or a default decides.
type Action string

// The actions, strictest last.
const (
	Allow Action = "allow"
	Ask   Action = "ask"
	Deny  Action = "deny"
)

// strictness orders actions: deny > ask > allow.
func (a Action) strictness() int {
	switch a {
	case Deny:
		return 2
	case Ask:
		return 1
	default:
		return 0
	}
}

// Stricter reports whether a decides more strictly than b.
func (a Action) Stricter(b Action) bool { return a.strictness() > b.strictness() }

// Valid reports whether a is one of the three actions.
func (a Action) Valid() bool { return a == Allow || a == Ask || a == Deny }

// or returns a when it is valid, empty when a is unset, and Deny when a is
// something else: a policy that names no action falls back to its
// documented default, one that names an unknown action fails closed.
func (a Action) or(empty Action) Action {
	switch {
	case a == "":
		return empty
	case a.Valid():
		return a
	default:
		return Deny
	}
}

// normalAction lower-cases and trims what a person typed.
func normalAction(a Action) Action { return Action(strings.ToLower(strings.TrimSpace(string(a)))) }

// Decision is the outcome of evaluating a policy.
type Decision struct {
	Action Action
	// Rule is the index of the deciding rule, -1 when the default (or the
	// dynamic setting) decided.
	Rule int
	// Why names what decided, to follow "by": "rule 2: deny program rm",
	// "the default (no rule matches)".
	Why string
}

// ruleWhy is the Why of a decision taken by rule i.
func ruleWhy(i int, desc, reason string) string {
	s := "rule " + strconv.Itoa(i+1) + ": " + desc
	if reason != "" {
		s += ` ("` + reason + `")`
	}
	return s
}

// digest is the hex SHA-256 of v's canonical JSON.
func digest(v any) string {
	sum := sha256.Sum256(canonical(v))
	return hex.EncodeToString(sum[:])
}

// canonical is v encoded as compact JSON without HTML escaping; v is a
// normalized policy, whose field order is fixed by its struct.
func canonical(v any) []byte {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// A policy is plain strings, numbers and slices: it always encodes.
		panic("policy: encoding a policy: " + err.Error())
	}
	return []byte(strings.TrimSuffix(b.String(), "\n"))
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
