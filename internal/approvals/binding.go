package approvals

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"time"
)

// Requester is who asked to run the command, as command rows record their
// opener (recordings.Command's actor columns and Typist.Via).
type Requester struct {
	Type string `json:"type"`
	ID   string `json:"id"`
	Name string `json:"name"`
	// Via is the credential ("api_key:<id>", "login:<ref>").
	Via string `json:"via,omitempty"`
	// UserID is the org user behind the request (directly or through a
	// personal key); 0 for a service key. That person may not decide it.
	UserID int64 `json:"-"`
	// CreatorUserID is the user who created the requesting key
	// (directory.APIKey.CreatedByUserID; 0: none known). A service key's
	// creator may not decide its requests either.
	CreatorUserID int64 `json:"-"`
}

// Binding is exactly what will run once approved, and who asked. Env
// values are hashed into the digest and then forgotten: only their names
// are stored.
type Binding struct {
	SessionID    int64
	AgentID      int64
	DepartmentID *int64 // the agent's department; nil: the org's
	Requester    Requester
	Command      string
	// Program and Args are the simple command the policy asked about, as
	// the parser resolved it. A "session" grant does not key on them: it
	// covers only the same binding again (ProgramKey).
	Program string
	Args    []string
	Cwd     string
	Env     map[string]string
	TTY     bool
	Stdin   bool
	// Rule is the rule that asked, as text; PolicyDigest the digest of
	// the policy that held it (policy.Exec.Digest).
	Rule         string
	PolicyDigest string
	// Timeout is the agent's approval timeout (0: DefaultTimeout); it must
	// lie between MinTimeout and MaxTimeout.
	Timeout time.Duration
}

// Timeouts of a request.
const (
	DefaultTimeout = 10 * time.Minute
	MinTimeout     = time.Minute
	MaxTimeout     = 24 * time.Hour
)

// digestInput is the canonical encoding the digest covers: JSON with fixed
// field order and env sorted by name.
type digestInput struct {
	V         int         `json:"v"`
	SessionID int64       `json:"session_id"`
	Command   string      `json:"command"`
	Env       [][2]string `json:"env"` // name, hex SHA-256 of the value
	Cwd       string      `json:"cwd"`
	TTY       bool        `json:"tty"`
	Stdin     bool        `json:"stdin"`
}

// Digest is the SHA-256 (hex) of a canonical encoding of what will run:
// the session, the command text, each env name with the SHA-256 of its
// value, the working directory, TTY and stdin. Two bindings with the same
// digest run the same thing; any change makes a different one.
func (b Binding) Digest() string {
	in := digestInput{V: 1, SessionID: b.SessionID, Command: b.Command, Env: [][2]string{}, Cwd: b.Cwd, TTY: b.TTY, Stdin: b.Stdin}
	for _, name := range b.EnvNames() {
		h := sha256.Sum256([]byte(b.Env[name]))
		in.Env = append(in.Env, [2]string{name, hex.EncodeToString(h[:])})
	}
	raw, _ := json.Marshal(in) // plain strings, bools and ints: cannot fail
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// EnvNames are the env's names, sorted.
func (b Binding) EnvNames() []string {
	names := make([]string, 0, len(b.Env))
	for k := range b.Env {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// ProgramKey is what a "session" grant is keyed by: exactly what will run
// (Digest: the session, the whole command line as text, each env name with
// the SHA-256 of its value, the working directory, TTY and stdin), minus
// who asked and the rule. "The same command in this session" is the same
// binding again: another command appended ("; kubectl …"), a changed env
// value (GIT_SSH_COMMAND) or another directory asks again.
func (b Binding) ProgramKey() string { return b.Digest() }
