// Package policy holds what an agent may run and reach without a person:
// execution rules over programs and their arguments, network rules over
// hosts and ports, their validation, and their evaluation. The console
// checks requests against them; agentd applies the same rules where
// programs start and connections leave, from the copy each create carries.
package policy

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
