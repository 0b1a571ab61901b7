package handlers

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/terminal"
	"github.com/gatehouse/gatehouse/internal/views"
)

// registerRecordings is the route table of recorded commands: replay,
// downloads and search. A recording is readable by whoever may read its
// session's terminal (the gateway's read check: the session's user,
// department owners, org admins, auditors); searching across the org needs
// "recordings read" (auditors, org admins). Every read and every search is
// audited once per request.
func (s *Server) registerRecordings(api, pg *group) {
	api.handle(http.MethodGet, "/recordings", rbac.Org("recordings", "read"), s.apiSearchRecordings)
	api.handle(http.MethodGet, "/sessions/:id/commands/:cid/recording", rbac.Authenticated(), s.getRecording)
	pg.handle(http.MethodGet, "/recordings", rbac.Org("recordings", "read"), s.pageRecordings)
	pg.handle(http.MethodGet, "/sessions/:id/commands/:cid/replay", rbac.Authenticated(), s.pageReplay)
	pg.handle(http.MethodGet, "/sessions/:id/commands/:cid/recording", rbac.Authenticated(), s.getRecording)
}

// recordedCommand reads the command of the path once the caller may read
// its session's recordings; a command of another session is not found.
func (s *Server) recordedCommand(c echo.Context) (recordings.Command, error) {
	sid, cid, err := commandParams(c)
	if err != nil {
		return recordings.Command{}, err
	}
	if err := s.Gateway.AuthorizeRead(c.Request().Context(), s.terminalOrg(c), actorOf(c), sid); err != nil {
		return recordings.Command{}, err
	}
	return recordings.GetInSession(c.Request().Context(), tenantOf(c).DB, sid, cid)
}

func recordingURL(slug string, cmd recordings.Command) string {
	return fmt.Sprintf("/o/%s/sessions/%d/commands/%d", slug, cmd.SessionID, cmd.ID)
}

// getRecording serves a command's recorded output as ?format=cast
// (asciicast v2, the default), txt (escapes removed) or json (the chunks),
// as an attachment with ?download=1. The read is audited before a byte is
// sent.
func (s *Server) getRecording(c echo.Context) error {
	format := c.QueryParam("format")
	if format == "" {
		format = "cast"
	}
	if format != "cast" && format != "txt" && format != "json" {
		return &apperr.ValidationError{Fields: map[string]string{"format": "format must be cast, txt or json."}}
	}
	cmd, err := s.recordedCommand(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	db := tenantOf(c).DB
	var opts recordings.CastOptions
	if format == "cast" {
		if opts.Resizes, err = s.resizes(c, cmd); err != nil {
			return err
		}
		if opts.Typists, err = recordings.TypistChanges(ctx, db, cmd.ID); err != nil {
			return err
		}
		// The replay page asks for newlines as a terminal shows them when
		// the command had no TTY; downloads stay byte for byte.
		opts.CRLF = c.QueryParam("eol") == "crlf" && !cmd.TTY
	}
	if err := s.audited(c, "recording.read", cmd.Target(), map[string]any{"session_id": cmd.SessionID, "format": format}); err != nil {
		return err
	}
	h := c.Response().Header()
	if c.QueryParam("download") == "1" {
		h.Set(echo.HeaderContentDisposition, fmt.Sprintf(`attachment; filename="command-%d.%s"`, cmd.ID, format))
	}
	w := c.Response()
	switch format {
	case "cast":
		h.Set(echo.HeaderContentType, "application/x-asciicast")
		err = recordings.WriteCast(ctx, db, w, cmd, opts)
	case "txt":
		h.Set(echo.HeaderContentType, echo.MIMETextPlainCharsetUTF8)
		err = recordings.WriteText(ctx, db, w, cmd)
	default:
		h.Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
		err = writeRecordingJSON(c, cmd)
	}
	if err != nil {
		if !w.Committed {
			h.Del(echo.HeaderContentDisposition)
			h.Del(echo.HeaderContentType)
			return err
		}
		// Mid-stream: the status is out; the log says why it stopped.
		s.Logger.Error("recording read failed", "org", tenantOf(c).Org.Slug, "command", cmd.ID, "error", err)
	}
	return nil
}

// recordingEvent is one chunk in the JSON form of a recording, or a
// change of typist.
type recordingEvent struct {
	// T is seconds since the command started.
	T float64 `json:"t"`
	// Seq is the output chunk's id; for a typist change, the input
	// chain's sequence number of the typist's first frame.
	Seq    uint64 `json:"seq"`
	Stream string `json:"stream"`
	// Data is the bytes, base64; for a gap, the number of bytes lost; for
	// a typist change, null.
	Data []byte `json:"data"`
	// Typist is who types from here on (stream "typist" only).
	Typist *recordingTypist `json:"typist,omitempty"`
}

// recordingTypist is a typist in the JSON form of a recording.
type recordingTypist struct {
	Type string `json:"type"`
	ID   string `json:"id"`
	Name string `json:"name"`
	Via  string `json:"via"`
}

// writeRecordingJSON streams {"command": ..., "events": [...]} a chunk at a
// time.
func writeRecordingJSON(c echo.Context, cmd recordings.Command) error {
	w := c.Response()
	head, err := json.Marshal(toCommandJSON(cmd))
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, `{"command":%s,"events":[`, head); err != nil {
		return err
	}
	typists, err := recordings.TypistChanges(c.Request().Context(), tenantOf(c).DB, cmd.ID)
	if err != nil {
		return err
	}
	n := 0
	write := func(ev recordingEvent) error {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if n > 0 {
			b = append([]byte{','}, b...)
		}
		n++
		_, err = w.Write(b)
		return err
	}
	// Typist changes go in time order among the chunks.
	typistsUpTo := func(at time.Time) error {
		for len(typists) > 0 && !typists[0].At.After(at) {
			tc := typists[0]
			typists = typists[1:]
			ev := recordingEvent{T: max(tc.At.Sub(cmd.StartedAt).Seconds(), 0), Seq: tc.Seq, Stream: recordings.StreamTypist,
				Typist: &recordingTypist{Type: tc.Typist.Type, ID: tc.Typist.ID, Name: tc.Typist.Name, Via: tc.Typist.Via}}
			if err := write(ev); err != nil {
				return err
			}
		}
		return nil
	}
	err = recordings.Walk(c.Request().Context(), tenantOf(c).DB, cmd.ID, recordings.KindOut, func(ch recordings.Chunk) error {
		if err := typistsUpTo(ch.At); err != nil {
			return err
		}
		return write(recordingEvent{T: max(ch.At.Sub(cmd.StartedAt).Seconds(), 0), Seq: ch.Seq, Stream: ch.Stream, Data: ch.Data})
	})
	if err != nil {
		return err
	}
	if err := typistsUpTo(time.Unix(1<<40, 0)); err != nil {
		return err
	}
	_, err = w.Write([]byte("]}\n"))
	return err
}

// resizes reads a command's window changes from its audit events: the
// browser terminal sets the size when it attaches and whenever the window
// changes.
func (s *Server) resizes(c echo.Context, cmd recordings.Command) ([]recordings.Resize, error) {
	id := strconv.FormatInt(cmd.ID, 10)
	f, err := audit.ParseQuery("action:command.resize target:" + id)
	if err != nil {
		return nil, err
	}
	evs, err := tenantOf(c).Audit.Query(c.Request().Context(), f, 0, audit.MaxPageSize)
	if err != nil {
		return nil, fmt.Errorf("read window sizes of command %d: %w", cmd.ID, err)
	}
	var out []recordings.Resize
	for _, ev := range slices.Backward(evs) {
		var d struct{ Rows, Cols int }
		if ev.Action != "command.resize" || ev.Target.ID != id || json.Unmarshal(ev.Details, &d) != nil || d.Rows < 1 || d.Cols < 1 {
			continue
		}
		out = append(out, recordings.Resize{At: ev.Time, Cols: d.Cols, Rows: d.Rows})
	}
	return out, nil
}

// pageReplay plays a command's recording; ?t= starts it that many seconds
// in (a search hit's moment). The page lists the recording's typed lines
// and programs (an audited read); the player fetches the rest, and that
// read is audited too.
func (s *Server) pageReplay(c echo.Context) error {
	cmd, err := s.recordedCommand(c)
	if err != nil {
		return err
	}
	start := ""
	if v := c.QueryParam("t"); v != "" {
		t, err := strconv.ParseFloat(v, 64)
		if err != nil || t < 0 || t > 1e7 {
			return &apperr.ValidationError{Fields: map[string]string{"t": "t must be a number of seconds into the recording."}}
		}
		start = strconv.FormatFloat(t, 'f', -1, 64)
	}
	slug := tenantOf(c).Org.Slug
	base := recordingURL(slug, cmd) + "/recording"
	d := views.ReplayData{Slug: slug, SessionID: cmd.SessionID, CommandRow: commandRow(cmd), Truncated: cmd.Truncated,
		CastURL: base + "?format=cast&eol=crlf", CastDownload: base + "?format=cast&download=1", TextDownload: base + "?format=txt&download=1",
		StartAt: start}
	if err := s.replayOutline(c, cmd, &d); err != nil {
		return err
	}
	replayCSP(c)
	return render(c, http.StatusOK, views.ReplayPage(s.orgPage(c, "Replay of command "+strconv.FormatInt(cmd.ID, 10)), d))
}

// replayOutline fills the replay's jump lists (typed lines, programs
// started) from the recording; reading them is a read of the recording,
// audited as one.
func (s *Server) replayOutline(c echo.Context, cmd recordings.Command, d *views.ReplayData) error {
	if err := s.audited(c, "recording.read", cmd.Target(), map[string]any{"session_id": cmd.SessionID, "format": "outline"}); err != nil {
		return err
	}
	o, err := recordings.ReadOutline(c.Request().Context(), tenantOf(c).DB, cmd)
	if err != nil {
		return err
	}
	exit := func(code *int) string {
		if code == nil {
			return ""
		}
		return strconv.Itoa(*code)
	}
	for _, l := range o.Lines {
		d.Lines = append(d.Lines, views.ReplayLine{At: recordings.Seconds(l.At), Text: l.Text, Exit: exit(l.ExitCode)})
	}
	for _, p := range o.Programs {
		d.Programs = append(d.Programs, views.ReplayLine{At: recordings.Seconds(p.At), Text: p.Line, Exit: exit(p.ExitCode)})
	}
	d.ProgramsTotal = o.ProgramsTotal
	return nil
}

// replayCSP is the terminal's policy plus WebAssembly: asciinema-player
// runs its terminal emulator as WebAssembly and injects its styles.
// Scripts stay limited to the console's files.
func replayCSP(c echo.Context) {
	c.Response().Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self' 'wasm-unsafe-eval'; connect-src 'self'; frame-ancestors 'none'; form-action 'self'")
}

// searchRequest is a search as the page and the API take it: ?q=, the
// page's date inputs ?since= and ?until= (dates, UTC), ?before= and
// ?limit=.
type searchRequest struct {
	q      recordings.Query
	before int64
	limit  int
}

func parseSearch(c echo.Context) (searchRequest, error) {
	var r searchRequest
	var err error
	if r.q, err = recordings.ParseQuery(c.QueryParam("q")); err != nil {
		return r, err
	}
	for _, name := range []string{"since", "until"} {
		v := c.QueryParam(name)
		if v == "" {
			continue
		}
		t, isDate, err := recordings.When(v)
		if err != nil {
			return r, &apperr.ValidationError{Fields: map[string]string{"q": name + " must be a date like 2026-01-02."}}
		}
		if name == "since" {
			r.q.Since = t
		} else {
			r.q.Until = recordings.UntilOf(t, isDate)
		}
	}
	if v := c.QueryParam("before"); v != "" {
		if r.before, err = strconv.ParseInt(v, 10, 64); err != nil || r.before < 1 {
			return r, &apperr.ValidationError{Fields: map[string]string{"before": "before must be a command id."}}
		}
	}
	r.limit = recordings.DefaultSearchPage
	if v := c.QueryParam("limit"); v != "" {
		if r.limit, err = strconv.Atoi(v); err != nil || r.limit < 1 || r.limit > recordings.MaxSearchPage {
			return r, &apperr.ValidationError{Fields: map[string]string{"limit": fmt.Sprintf("limit must be from 1 to %d.", recordings.MaxSearchPage)}}
		}
	}
	return r, nil
}

// searchRecordings runs the request's search; searching is audited, with
// how many commands it found.
func (s *Server) searchRecordings(c echo.Context) ([]recordings.Hit, searchRequest, error) {
	r, err := parseSearch(c)
	if err != nil {
		return nil, r, err
	}
	hits, err := recordings.Search(c.Request().Context(), tenantOf(c).DB, r.q, r.before, r.limit)
	if err != nil {
		return nil, r, err
	}
	details := map[string]any{"q": c.QueryParam("q"), "since": c.QueryParam("since"), "until": c.QueryParam("until"), "before": r.before, "found": len(hits)}
	if err := s.audited(c, "recording.search", audit.Target{Type: "recordings"}, details); err != nil {
		return nil, r, err
	}
	return hits, r, nil
}

// replayAt is the replay of a hit, at its moment.
func replayAt(slug string, h recordings.Hit) string {
	u := recordingURL(slug, h.Command) + "/replay"
	if h.At > 0 {
		u += "?t=" + strconv.FormatFloat(h.At, 'f', -1, 64)
	}
	return u
}

// recordingHitJSON is a search hit in the API.
type recordingHitJSON struct {
	commandJSON
	AgentID   int64   `json:"agent_id"`
	Agent     string  `json:"agent"`
	At        float64 `json:"at"`
	Snippet   string  `json:"snippet,omitempty"`
	Capped    bool    `json:"capped"`
	ReplayURL string  `json:"replay_url"`
}

func (s *Server) apiSearchRecordings(c echo.Context) error {
	hits, r, err := s.searchRecordings(c)
	if err != nil {
		return err
	}
	slug := tenantOf(c).Org.Slug
	items := make([]recordingHitJSON, len(hits))
	for i, h := range hits {
		items[i] = recordingHitJSON{commandJSON: toCommandJSON(h.Command), AgentID: h.AgentID, Agent: h.AgentName, At: h.At,
			Snippet: h.Snippet, Capped: h.Capped, ReplayURL: replayAt(slug, h)}
	}
	resp := map[string]any{"items": items}
	if len(hits) == r.limit {
		resp["next_before"] = hits[len(hits)-1].Command.ID
	}
	return c.JSON(http.StatusOK, resp)
}

func (s *Server) pageRecordings(c echo.Context) error {
	slug := tenantOf(c).Org.Slug
	base := "/o/" + slug + "/recordings"
	rp := views.RecordingsPage{Action: base, Query: c.QueryParam("q"), Since: c.QueryParam("since"), Until: c.QueryParam("until")}
	rp.Searched = rp.Query != "" || rp.Since != "" || rp.Until != ""
	hits, r, err := s.searchRecordings(c)
	if err != nil {
		if fields, status, ok := formFailure(err); ok {
			rp.FilterError = firstNonEmpty(fields["q"], fields["before"], fields["limit"], fields["form"])
			return render(c, status, views.Recordings(s.orgPage(c, "Recordings"), rp))
		}
		return err
	}
	for _, h := range hits {
		vh := views.RecordingHit{CommandRow: commandRow(h.Command), SessionID: h.Command.SessionID, Agent: h.AgentName, Snippet: h.Snippet,
			ReplayURL: replayAt(slug, h), SessionURL: fmt.Sprintf("/o/%s/sessions/%d", slug, h.Command.SessionID), Capped: h.Capped}
		if h.At > 0 {
			vh.At = (time.Duration(h.At*1000) * time.Millisecond).String()
		}
		rp.Hits = append(rp.Hits, vh)
	}
	keep := url.Values{}
	for _, k := range []string{"q", "since", "until"} {
		if v := c.QueryParam(k); v != "" {
			keep.Set(k, v)
		}
	}
	if len(hits) == r.limit {
		next := url.Values{}
		for k, v := range keep {
			next[k] = v
		}
		next.Set("before", strconv.FormatInt(hits[len(hits)-1].Command.ID, 10))
		rp.NextURL = base + "?" + next.Encode()
	}
	if r.before > 0 {
		rp.FirstURL = base + "?" + keep.Encode()
	}
	return render(c, http.StatusOK, views.Recordings(s.orgPage(c, "Recordings"), rp))
}

// replayLinks adds a Replay link to audit rows about a command whose
// session the event names (command.exec, command.end, terminal.command,
// ...), starting at the event's moment in the recording, and names an
// interactive shell as one rather than by its bootstrap script. The
// replay page checks access when followed.
func replayLinks(ctx context.Context, db *gorm.DB, slug string, evs []audit.Event, rows []views.AuditRow) error {
	sessions := make(map[int]int64, len(evs))
	closing := make(map[int]bool)
	var ids []int64
	for i, ev := range evs {
		if ev.Target.Type != "command" || ev.Target.ID == "" {
			continue
		}
		var d struct {
			SessionID int64  `json:"session_id"`
			State     string `json:"state"`
			Reason    string `json:"reason"`
		}
		cid, err := strconv.ParseInt(ev.Target.ID, 10, 64)
		if err != nil || json.Unmarshal(ev.Details, &d) != nil || d.SessionID < 1 {
			continue
		}
		sessions[i] = d.SessionID
		// A command.end of a shell its close ended (killed, or with its
		// session) reads "closed" once the command is known as a shell.
		closing[i] = ev.Action == "command.end" && (d.State == recordings.StateKilled || recordings.EndedBySessionClose(d.Reason))
		ids = append(ids, cid)
	}
	opened, err := recordings.Openings(ctx, db, ids, terminal.ShellCommand)
	if err != nil {
		return err
	}
	for i, sid := range sessions {
		cid, _ := strconv.ParseInt(evs[i].Target.ID, 10, 64)
		u := fmt.Sprintf("/o/%s/sessions/%d/commands/%d/replay", slug, sid, cid)
		o, ok := opened[cid]
		if ok {
			if at := evs[i].Time.Sub(o.StartedAt).Seconds(); at > 0 {
				u += "?t=" + strconv.FormatFloat(math.Round(at*1000)/1000, 'f', -1, 64)
			}
			// A program the shell started is named by its own line.
			// The target is then the script, as much as the event kept;
			// its details hold the whole command line.
			if o.Shell && evs[i].Action != recordings.ActionTerminalCommand {
				rows[i].Shell, rows[i].Target, rows[i].Closed = cid, evs[i].Target.Name, closing[i]
			}
		}
		rows[i].Replay = u
	}
	return nil
}
