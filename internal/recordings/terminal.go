package recordings

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/clip"
)

// StreamExec holds agentd's exec records: the programs the kernel saw
// start in the command's process tree, one JSON object per line (see
// agentd.ExecRecord). They are searchable as "$ argv" lines and shown
// apart from the terminal's output in replay; they are never written to a
// terminal.
const StreamExec = agentd.StreamExec

// ActionTerminalCommand is the audit action of a program an interactive
// shell started (its direct children): what a person ran, from the
// kernel, not from the shell.
const ActionTerminalCommand = "terminal.command"

// terminalCommandName bounds the command line naming a terminal.command
// event's target (its details keep the whole argv, which agentd bounds to
// 4 KiB).
const terminalCommandName = 200

// countsAsOutput reports whether a chunk of stream counts in a command's
// output bytes: what the command printed, not a gap's count or agentd's
// exec records.
func countsAsOutput(stream string) bool {
	return stream != StreamGap && stream != StreamExec && stream != StreamTypist
}

// shellProgram is a program a shell started directly, as one batch's exec
// records tell: its exec record, when it started, its exit code when its
// exit record came in the same batch.
type shellProgram struct {
	rec agentd.ExecRecord
	at  time.Time
	end *int
	// seen is when the console received the record (its chunk's time).
	seen time.Time
}

// typedAt is the moment whose typist a program is attributed to: when
// agentd says it started, but never after the console received its
// record. agentd's clock is the host's (or a sandbox's), not the
// console's that stamps keystrokes: a host clock running ahead would
// otherwise blame whoever typed after the program started.
func (p *shellProgram) typedAt() time.Time {
	if !p.seen.IsZero() && p.at.After(p.seen) {
		return p.seen
	}
	return p.at
}

// terminalCommandsTx appends the terminal.command events of the exec
// records among fresh (chunks being stored for command c) inside tx: one
// per program a direct child of c's shell (its leader, or an interactive
// shell started in it: agentd marks them shell_child) ran first after its
// fork. Only
// interactive shells (commands on a TTY) have them: an agent's exec is
// audited by its command.exec, and every program below it stays in the
// recording. An exit record in the same batch gives the event its exit
// code. Records that do not decode are skipped here (the recording keeps
// their bytes).
func terminalCommandsTx(ctx context.Context, tx *gorm.DB, log *audit.Log, c Command, fresh []Chunk) error {
	if log == nil || !c.TTY {
		return nil
	}
	var events []*shellProgram
	byPID := map[int]*shellProgram{}
	for _, ch := range fresh {
		if ch.Stream != StreamExec {
			continue
		}
		recs, _ := agentd.ParseExecRecords(ch.Data)
		for _, r := range recs {
			switch {
			case r.Type == agentd.ExecRecordExec && r.ShellChild && r.First:
				p := &shellProgram{rec: r, at: r.Time, seen: ch.At}
				if p.at.IsZero() {
					p.at = ch.At
				}
				events = append(events, p)
				byPID[r.PID] = p
			case r.Type == agentd.ExecRecordExit:
				if p := byPID[r.PID]; p != nil {
					p.end = r.ExitCode
				}
			}
		}
	}
	// A loop at a prompt (for i in $(seq 100000); do /bin/true; done)
	// starts programs as fast as the kernel forks: past the first
	// MaxTerminalCommandsPerBatch of a batch, its programs are one
	// coalesced event, so the audit log grows with the batches stored
	// (each a poll of agentd), not with the processes a shell can start.
	// Every one of them stays in the recording's exec stream.
	if len(events) > MaxTerminalCommandsPerBatch {
		if err := coalescedCommandsTx(ctx, tx, log, c, events[MaxTerminalCommandsPerBatch:]); err != nil {
			return err
		}
		events = events[:MaxTerminalCommandsPerBatch]
	}
	for _, p := range events {
		typist, err := typistBefore(ctx, tx, c, p.typedAt())
		if err != nil {
			return err
		}
		details := map[string]any{"session_id": c.SessionID, "command_id": c.ID, "pid": p.rec.PID, "ppid": p.rec.PPID,
			"argv": p.rec.Argv, "cwd": p.rec.Cwd, "at": p.at.UTC().Format(time.RFC3339Nano)}
		if p.rec.UID != nil {
			details["uid"] = *p.rec.UID
		}
		if p.end != nil {
			details["exit_code"] = *p.end
		}
		if p.rec.ArgvTruncated {
			details["argv_truncated"] = true
		}
		if p.rec.ArgvUnavailable {
			details["argv_unavailable"] = true
			details["comm"] = p.rec.Comm
		}
		name := strings.TrimPrefix(agentd.ExecLine(p.rec), "$ ")
		if _, err := log.AppendTx(ctx, tx, audit.Event{Actor: typist, Action: ActionTerminalCommand,
			Target:   audit.Target{Type: "command", ID: strconv.FormatInt(c.ID, 10), Name: clip.String(name, terminalCommandName)},
			Decision: audit.Allow, Details: audit.Details(details)}); err != nil {
			return fmt.Errorf("audit terminal command: %w", err)
		}
	}
	return nil
}

// MaxTerminalCommandsPerBatch bounds the terminal.command events of one
// stored batch of a command's output that name one program each; the
// rest of the batch's shell children are one event with "coalesced".
const MaxTerminalCommandsPerBatch = 100

// coalescedCommandsTx writes the one terminal.command event standing for
// rest (programs of one batch past MaxTerminalCommandsPerBatch): how
// many, the first and last of them, and the typist before the last.
func coalescedCommandsTx(ctx context.Context, tx *gorm.DB, log *audit.Log, c Command, rest []*shellProgram) error {
	first, firstAt := rest[0].rec, rest[0].at
	last, lastAt := rest[len(rest)-1].rec, rest[len(rest)-1].at
	typist, err := typistBefore(ctx, tx, c, rest[len(rest)-1].typedAt())
	if err != nil {
		return err
	}
	details := map[string]any{"session_id": c.SessionID, "command_id": c.ID, "coalesced": len(rest),
		"first_argv": first.Argv, "first_at": firstAt.UTC().Format(time.RFC3339Nano),
		"last_argv": last.Argv, "at": lastAt.UTC().Format(time.RFC3339Nano)}
	name := strconv.Itoa(len(rest)) + " more programs, the last " + strings.TrimPrefix(agentd.ExecLine(last), "$ ")
	if _, err := log.AppendTx(ctx, tx, audit.Event{Actor: typist, Action: ActionTerminalCommand,
		Target:   audit.Target{Type: "command", ID: strconv.FormatInt(c.ID, 10), Name: clip.String(name, terminalCommandName)},
		Decision: audit.Allow, Details: audit.Details(details)}); err != nil {
		return fmt.Errorf("audit coalesced terminal commands: %w", err)
	}
	return nil
}

// typistBefore is who typed the last input into command c at or before at:
// the person a program the shell started is attributed to (the opener
// when nobody typed yet).
func typistBefore(ctx context.Context, tx *gorm.DB, c Command, at time.Time) (audit.Actor, error) {
	t, err := TypistBefore(ctx, tx, c.ID, at)
	if err != nil {
		return audit.Actor{}, err
	}
	return audit.Actor{Type: t.Type, ID: t.ID, Name: t.Name}, nil
}

// execText turns exec chunk data into the lines a recording's text shows
// for it: "$ argv" per program started (exit and other records add
// nothing), each on a line of its own.
func execText(dst, data []byte) []byte {
	recs, _ := agentd.ParseExecRecords(data)
	for _, r := range recs {
		if r.Type != agentd.ExecRecordExec {
			continue
		}
		if len(dst) > 0 && dst[len(dst)-1] != '\n' {
			dst = append(dst, '\n')
		}
		dst = append(dst, agentd.ExecLine(r)...)
		dst = append(dst, '\n')
	}
	return dst
}
