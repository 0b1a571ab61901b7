package agentd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// StreamExec is the stream of exec records: what the kernel says ran in a
// session (see ExecRecord). A session carries it only when its create asked
// with HeaderExecRecords, so a client that never asks never sees it.
const StreamExec = "exec"

// streamExec is StreamExec's number in the ring and the binary framing.
const streamExec uint8 = 3

// HeaderExecRecords is sent with a create (value "1") to ask for the
// session's exec records, and answered on the create with "on" when they
// are reported or "unavailable" when this agentd cannot report them. An
// older agentd neither sends it back nor reports anything, and an older
// client never asks, so neither sees a stream it does not know.
const HeaderExecRecords = "Agentd-Exec-Records"

// Values of HeaderExecRecords on a create's answer.
const (
	ExecRecordsOn          = "on"
	ExecRecordsUnavailable = "unavailable"
)

// Exec reporting states of Health.ExecReporting.
const (
	ExecReportingNetlink     = "netlink"     // the kernel's process-events connector
	ExecReportingUnavailable = "unavailable" // not on this platform or without privilege
	ExecReportingOff         = "off"         // turned off by --exec-reporting off
)

// Exec record types.
const (
	ExecRecordExec = "exec" // a process started a program
	ExecRecordExit = "exit" // a direct child of the session's leader ended
	ExecRecordLost = "lost" // records agentd could not keep (Count says how many)
)

// MaxExecArgv bounds the argv of one exec record, all arguments together
// (their bytes plus one separator each); longer ones are cut and marked.
const MaxExecArgv = 4 << 10

// ExecRecord is one line of the exec stream: JSON, one object per line.
type ExecRecord struct {
	Type string    `json:"type"`
	Time time.Time `json:"time"`
	PID  int       `json:"pid,omitempty"`
	// PPID is the parent that forked the process (as it was at fork time).
	PPID int `json:"ppid,omitempty"`
	// Depth is the distance from the session's leader (the shell agentd
	// started, 0); the leader's direct children are 1.
	Depth int `json:"depth"`
	// First is set on the first program a process runs after its fork; a
	// later exec of the same process (bash -c 'x' execs x in place) is not
	// first.
	First bool `json:"first,omitempty"`
	// ShellChild marks a process whose parent is the session's leader or
	// an interactive shell started in it (a shell by name with options
	// only: bash, bash -l; not bash -c or sh script.sh): a program a person
	// ran at a prompt. Exit records are sent for these.
	ShellChild bool     `json:"shell_child,omitempty"`
	UID        *uint32  `json:"uid,omitempty"`
	Cwd        string   `json:"cwd,omitempty"`
	Argv       []string `json:"argv,omitempty"`
	// ArgvTruncated marks an argv cut to MaxExecArgv.
	ArgvTruncated bool `json:"argv_truncated,omitempty"`
	// ArgvUnavailable marks a process gone before agentd could read its
	// argv and cwd: the record keeps what the kernel said (pid, parent,
	// time).
	ArgvUnavailable bool `json:"argv_unavailable,omitempty"`
	// Comm is the kernel's short name (at most 15 bytes) of a process
	// whose argv was unavailable, when even that much could be read.
	Comm string `json:"comm,omitempty"`
	// ExitCode of an exit record: the exit status, or 128+signal.
	ExitCode *int `json:"exit_code,omitempty"`
	// Count of a lost record.
	Count int `json:"count,omitempty"`
}

// appendExecRecord appends r as one JSON line.
func appendExecRecord(dst []byte, r ExecRecord) []byte { return appendJSONLine(dst, r) }

// ParseExecRecords decodes the data of exec chunks (one JSON object per
// line; a chunk may hold several, and a record never spans chunks). A line
// that does not decode is an error naming it; what came before it is
// returned.
func ParseExecRecords(data []byte) ([]ExecRecord, error) {
	return parseJSONLines[ExecRecord](data, "exec record")
}

// appendJSONLine appends r as one JSON line.
func appendJSONLine[T any](dst []byte, r T) []byte {
	b, err := json.Marshal(r)
	if err != nil { // cannot happen: every record type's fields encode
		return dst
	}
	return append(append(dst, b...), '\n')
}

// parseJSONLines decodes one JSON object per line, skipping blank lines;
// a line that does not decode is an error naming it (as the n-th what),
// with what came before it returned.
func parseJSONLines[T any](data []byte, what string) ([]T, error) {
	var out []T
	for n := 1; len(data) > 0; n++ {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r T
		if err := json.Unmarshal(line, &r); err != nil {
			return out, fmt.Errorf("agentd: %s %d: %w", what, n, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// boundArgv cuts argv to MaxExecArgv bytes in all (each argument counting
// one more for its separator) and reports whether it cut.
func boundArgv(argv []string) ([]string, bool) {
	total := 0
	for i, a := range argv {
		if total+len(a)+1 > MaxExecArgv {
			if room := MaxExecArgv - total - 1; room > 0 {
				return append(argv[:i:i], a[:room]), true
			}
			return argv[:i:i], true
		}
		total += len(a) + 1
	}
	return argv, false
}

// splitCmdline turns /proc/PID/cmdline (NUL-separated, NUL-terminated)
// into an argv.
func splitCmdline(b []byte) []string {
	b = bytes.TrimSuffix(b, []byte{0})
	if len(b) == 0 {
		return nil
	}
	parts := bytes.Split(b, []byte{0})
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = string(p)
	}
	return out
}

// ExecLine is how an exec record reads in a recording's text: "$ argv..."
// with the arguments quoted where a shell would need it, so a search for
// a word of any program that ran finds it.
func ExecLine(r ExecRecord) string {
	var b []byte
	b = append(b, "$ "...)
	if r.ArgvUnavailable || len(r.Argv) == 0 {
		b = append(b, '(')
		if r.Comm != "" {
			b = append(b, r.Comm...)
			b = append(b, ", "...)
		}
		b = append(b, "pid "...)
		b = strconv.AppendInt(b, int64(r.PID), 10)
		b = append(b, " ended before its arguments could be read)"...)
		return string(b)
	}
	for i, a := range r.Argv {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, shellQuote(a)...)
	}
	if r.ArgvTruncated {
		b = append(b, " …"...)
	}
	return string(b)
}

// shellQuote quotes a for a shell when it holds anything but plain
// characters.
func shellQuote(a string) string {
	if a == "" {
		return "''"
	}
	for _, c := range []byte(a) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || bytes.IndexByte([]byte("-_./=:,+@%"), c) >= 0) {
			return "'" + string(bytes.ReplaceAll([]byte(a), []byte("'"), []byte(`'\''`))) + "'"
		}
	}
	return a
}
