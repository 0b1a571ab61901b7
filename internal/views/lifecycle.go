package views

import (
	"strconv"
	"time"
)

// SessionTimes is what a session's lifecycle sentence is computed from.
type SessionTimes struct {
	SandboxMode string
	State       string
	// LastUsed is the last use (or the start, or the creation).
	LastUsed time.Time
	// Idle is the agent's idle timeout; Reclaim how long a paused sandbox
	// is kept.
	Idle, Reclaim time.Duration
}

// Lifecycle says in one sentence what will happen to a session and when:
// a per-session sandbox pauses after the agent's idle timeout without use
// and is reclaimed (deleted, the session closed) once paused longer than
// the agent's reclaim window. Times are estimates from the last use: any
// use moves them.
func Lifecycle(s SessionTimes) string {
	pause := s.LastUsed.Add(s.Idle)
	reclaim := pause.Add(s.Reclaim)
	switch {
	case s.State == "closed" || s.State == "lost":
		return "Ended: nothing runs any more. Its commands, recordings and audit trail stay."
	case s.SandboxMode != "per-session":
		return "Runs on a shared host: nothing pauses or reclaims it. Close it when you are done."
	case s.State == "pending":
		return "Not started: its sandbox is created on first use. Then it pauses after " + span(s.Idle) +
			" without use and is reclaimed (sandbox deleted, session closed) after " + span(s.Reclaim) + " paused."
	case s.State == "paused":
		return "Paused: the next use resumes it. Unless used, it is reclaimed (sandbox deleted, session closed) around " + When(reclaim) +
			" (" + span(s.Reclaim) + " after pausing)."
	}
	return "Pauses after " + span(s.Idle) + " without use: around " + When(pause) + " unless used. Reclaimed (sandbox deleted, session closed) " +
		span(s.Reclaim) + " after pausing: around " + When(reclaim) + "."
}

// span says a duration the way people do: 15 min, 1 h, 1 h 30 min.
func span(d time.Duration) string {
	d = d.Round(time.Minute)
	h, m := int(d.Hours()), int(d.Minutes())%60
	switch {
	case h == 0:
		return strconv.Itoa(m) + " min"
	case m == 0:
		return strconv.Itoa(h) + " h"
	}
	return strconv.Itoa(h) + " h " + strconv.Itoa(m) + " min"
}
