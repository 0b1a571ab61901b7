// Package agentd holds the terminal daemon that runs in every execution
// environment (its HTTP server, wire types and limits) and the typed Go client
// the gateway uses to talk to it. The wire protocol is documented in
// docs/agentd-protocol.md.
package agentd

import "time"

// Version is the agentd build version. It is set at link time with
// -ldflags "-X github.com/gatehouse/gatehouse/internal/agentd.Version=...".
var Version = "dev"

// DefaultPort is the TCP port agentd listens on unless told otherwise.
const DefaultPort = 49984

// Session states. A session starts in StateRunning and ends in exactly one of
// the other three.
const (
	StateRunning  = "running"
	StateExited   = "exited"
	StateTimedOut = "timed_out"
	StateKilled   = "killed"
)

// Output streams of a chunk. TTY sessions only produce StreamPTY.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
	StreamPTY    = "pty"
)

// Protocol limits a client checks before sending, so that a request agentd
// would refuse is refused (or clamped) before it is recorded or forwarded.
const (
	// MaxTimeout is the largest timeout_ms of a session.
	MaxTimeout = 7 * 24 * time.Hour
	// MaxWait is the longest wait_ms of a create or a poll; agentd clamps
	// larger values.
	MaxWait = 60 * time.Second
	// MaxFileRead is the largest limit of one GET /v1/files, and what a
	// read without a limit returns at most.
	MaxFileRead = 64 << 20
	// MaxTTYDimension is the largest rows and cols of a PTY.
	MaxTTYDimension = 4096
)

// Protocol limits that are not configurable.
const (
	maxJSONBody      = 1 << 20  // JSON request bodies
	maxStdinBody     = 8 << 20  // stdin request bodies (base64 inflates)
	maxCommandLen    = 64 << 10 // command string length
	maxEnvVars       = 1024
	maxStatPaths     = 1024
	maxWait          = MaxWait
	maxTimeout       = MaxTimeout
	maxTTYDimension  = MaxTTYDimension
	defaultRows      = 24
	defaultCols      = 80
	maxFileReadLimit = MaxFileRead
)

// Health is the body of GET /healthz.
type Health struct {
	Status         string  `json:"status"`
	Version        string  `json:"version"`
	ActiveSessions int     `json:"active_sessions"`
	UptimeSeconds  float64 `json:"uptime_seconds"`
	// ProcessTracking says how agentd finds every process of a session:
	// "cgroup", "process-tree" (Linux without cgroups), "process-group"
	// (other unix) or "process" (Windows). See docs/agentd-protocol.md.
	ProcessTracking string `json:"process_tracking,omitempty"`
	// ExecReporting says whether sessions that ask get exec records (the
	// programs started in them, from the kernel): "netlink", "unavailable"
	// (another platform, or no privilege; ExecReportingReason says why)
	// or "off". An agentd older than exec records leaves it out.
	ExecReporting       string `json:"exec_reporting,omitempty"`
	ExecReportingReason string `json:"exec_reporting_reason,omitempty"`
	// EgressEnforcement says how sessions with a network policy are
	// confined: "netns", "landlock" or "unavailable";
	// EgressEnforcementReason says what is not confined (landlock) or why
	// nothing is (unavailable). See docs/agentd-protocol.md, "Network
	// egress".
	EgressEnforcement       string `json:"egress_enforcement,omitempty"`
	EgressEnforcementReason string `json:"egress_enforcement_reason,omitempty"`
}

// CreateSessionRequest is the body of POST /v1/sessions.
type CreateSessionRequest struct {
	// ID names the session instead of letting agentd choose (1 to 64 of
	// A-Z a-z 0-9 _ -): a client that records a command before starting it
	// (the console's gateway) knows its id up front, so a crash between the
	// two loses nothing. An id already in use is refused (409 id_in_use).
	ID string `json:"id,omitempty"`
	// Command is run through the shell (/bin/sh -c on unix).
	Command string `json:"command"`
	// Cwd is the working directory; relative paths resolve against the
	// server root (or agentd's own working directory without one).
	Cwd string `json:"cwd,omitempty"`
	// Env is added to agentd's environment (minus AGENTD_TOKEN).
	Env map[string]string `json:"env,omitempty"`
	// TTY runs the command on a pseudo-terminal of Rows x Cols.
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// Stdin keeps a pipe to the command's stdin open for POST .../stdin.
	// Without it a non-TTY command reads from /dev/null. TTY sessions always
	// accept stdin.
	Stdin bool `json:"stdin,omitempty"`
	// TimeoutMS kills the process group after that many milliseconds (0: none).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// WaitMS waits up to that long for the command to end before answering.
	WaitMS int64 `json:"wait_ms,omitempty"`
	// Overflow chooses what happens when the output buffer is full:
	// OverflowDrop (default) drops the oldest output; OverflowBlock stops
	// reading the command's output (so it blocks writing) until a poller
	// has asked past the oldest buffered chunk.
	Overflow string `json:"overflow,omitempty"`
	// NetworkPolicy confines the session's connections to what its rules
	// allow and reports each one (stream "net"); see NetworkPolicy.
	NetworkPolicy *NetworkPolicy `json:"network_policy,omitempty"`
	// ExecRecords asks for the session's exec records (stream "exec"). It
	// travels as the header HeaderExecRecords, not in the body, so an
	// agentd that does not know it ignores it instead of refusing the
	// body.
	ExecRecords bool `json:"-"`
}

// Output overflow policies of CreateSessionRequest.Overflow.
const (
	OverflowDrop  = "drop"
	OverflowBlock = "block"
)

// Chunk is one piece of output. IDs are consecutive per session, starting at 1.
type Chunk struct {
	ID     uint64 `json:"id"`
	Stream string `json:"stream"`
	Data   []byte `json:"data"`
}

// SessionResponse is the answer to POST /v1/sessions and
// GET /v1/sessions/{id}. One response carries at most about the server's
// poll byte cap of chunk data; More is set when chunks remain after
// NextCursor, so a reader continues from NextCursor until More is false.
// Once State is not running and More is false, the reader has seen all
// output.
type SessionResponse struct {
	SessionID    string  `json:"session_id"`
	PID          int     `json:"pid,omitempty"`
	TTY          bool    `json:"tty"`
	State        string  `json:"state"`
	ExitCode     *int    `json:"exit_code"`
	Chunks       []Chunk `json:"chunks"`
	NextCursor   uint64  `json:"next_cursor"`
	More         bool    `json:"more"`
	Truncated    bool    `json:"truncated"`
	DroppedBytes uint64  `json:"dropped_bytes"`
	// AckTo is set by the Client when the answering agentd honours the
	// ack_to poll parameter (its HeaderAckTo); it is not part of the JSON.
	AckTo bool `json:"-"`
	// ExecRecords is set by the Client on a create's answer from the
	// HeaderExecRecords answer header: ExecRecordsOn, ExecRecordsUnavailable,
	// or "" from an agentd that does not know exec records.
	ExecRecords string `json:"-"`
}

// HeaderAckTo marks the poll answers of an agentd that honours ack_to. An
// older agentd ignores the parameter and releases everything up to the
// cursor, so a recorder reads ahead only after seeing this header.
const HeaderAckTo = "Agentd-Ack-To"

// StdinRequest is the body of POST /v1/sessions/{id}/stdin. Exactly one of
// Data (base64) and Text may be set; EOF closes stdin after writing (on a TTY
// it sends Ctrl-D).
type StdinRequest struct {
	Data []byte `json:"data,omitempty"`
	Text string `json:"text,omitempty"`
	EOF  bool   `json:"eof,omitempty"`
}

// ResizeRequest is the body of POST /v1/sessions/{id}/resize.
type ResizeRequest struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// StatRequest is the body of POST /v1/files/stat.
type StatRequest struct {
	Paths []string `json:"paths"`
}

// FileStat describes one path of a stat batch. Error is set (and Exists
// false) when the path could not be examined, e.g. it escapes the root.
type FileStat struct {
	Path   string     `json:"path"`
	Exists bool       `json:"exists"`
	Type   string     `json:"type,omitempty"` // file, dir, symlink, other
	Size   int64      `json:"size"`
	Mode   string     `json:"mode,omitempty"` // octal permission bits, e.g. "0644"
	MTime  *time.Time `json:"mtime,omitempty"`
	Error  *ErrorBody `json:"error,omitempty"`
}

// StatResponse is the answer to POST /v1/files/stat, in request order.
type StatResponse struct {
	Results []FileStat `json:"results"`
}

// FetchRequest is the body of POST /v1/files/fetch.
type FetchRequest struct {
	URL       string `json:"url"`
	Path      string `json:"path"`
	MaxBytes  int64  `json:"max_bytes,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
	// Unpack, when ArchiveTarGz or ArchiveZip, unpacks the download into
	// Path as a directory (replacing one there) instead of keeping it as a
	// file, with the rules of PUT /v1/files/archive.
	Unpack string `json:"unpack,omitempty"`
	// SHA256 pins the download: hex SHA-256 the bytes must have, or the
	// fetch fails with checksum_mismatch and Path is left as it was.
	SHA256 string `json:"sha256,omitempty"`
}

// FetchResponse is the answer to POST /v1/files/fetch.
type FetchResponse struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	// SHA256 is the hex SHA-256 of the downloaded bytes; an older agentd
	// leaves it empty.
	SHA256 string `json:"sha256,omitempty"`
	// Files is the number of entries unpacked (0 without Unpack).
	Files int `json:"files,omitempty"`
}

// Archive formats of PUT /v1/files/archive and FetchRequest.Unpack.
const (
	ArchiveTarGz = "tar.gz"
	ArchiveZip   = "zip"
)

// WriteResponse is the answer to PUT /v1/files and PUT /v1/files/archive.
// Size and SHA256 describe the bytes sent (the file, or the archive);
// Files is the number of entries an archive unpacked into.
type WriteResponse struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Files  int    `json:"files,omitempty"`
}

// CopyRequest is the body of POST /v1/files/copy.
type CopyRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// CopyResponse is the answer to POST /v1/files/copy. For a single file
// SHA256 is the hex SHA-256 of its contents; for a directory it is the
// tree hash described in docs/agentd-protocol.md, and Size the total of
// its files' sizes.
type CopyResponse struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Files  int    `json:"files"`
}

// RekeyRequest is the body of POST /v1/token.
type RekeyRequest struct {
	Token string `json:"token"`
}

// MinRekeyTokenLength is the shortest token a rekey accepts: a token the
// console generates per sandbox, never typed by a person.
const MinRekeyTokenLength = 32

// FileHeaderSize carries the full size of a file read by GET /v1/files.
const FileHeaderSize = "X-Agentd-File-Size"

// ErrorBody is the inner object of the error envelope.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ErrorEnvelope is the body of every error response: {"error":{...}}.
type ErrorEnvelope struct {
	Error ErrorBody `json:"error"`
}
