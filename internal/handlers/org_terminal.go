package handlers

import (
	"errors"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/terminal"
	"github.com/gatehouse/gatehouse/internal/views"
)

// registerTerminal is the terminal gateway's route table, mounted under an
// org's JSON API. Every route passes any signed-in principal of the org;
// the gateway authorizes each operation on the session's terminal
// (internal/gateway), records it and only then forwards it.
func (s *Server) registerTerminal(api *group) {
	api.handle(http.MethodPost, "/sessions/:id/commands", rbac.Authenticated(), s.apiExec)
	api.handle(http.MethodGet, "/sessions/:id/commands", rbac.Authenticated(), s.apiCommands)
	api.handle(http.MethodGet, "/sessions/:id/commands/:cid/output", rbac.Authenticated(), s.apiOutput)
	api.handle(http.MethodPost, "/sessions/:id/commands/:cid/stdin", rbac.Authenticated(), s.apiStdin)
	api.handle(http.MethodPost, "/sessions/:id/commands/:cid/resize", rbac.Authenticated(), s.apiResize)
	api.handle(http.MethodDelete, "/sessions/:id/commands/:cid", rbac.Authenticated(), s.apiKill)
	api.handle(http.MethodGet, "/sessions/:id/files", rbac.Authenticated(), s.apiReadFile)
	api.handle(http.MethodPut, "/sessions/:id/files", rbac.Authenticated(), s.apiWriteFile)
	api.handle(http.MethodPost, "/sessions/:id/files/stat", rbac.Authenticated(), s.apiStat)
	api.handle(http.MethodPost, "/sessions/:id/files/fetch", rbac.Authenticated(), s.apiFetch)
	api.handle(http.MethodGet, "/settings/recordings", rbac.Org("settings", "read"), s.apiRecordingSettings)
	api.handle(http.MethodPut, "/settings/recordings", rbac.Org("settings", "update"), s.apiSetRecordingSettings)
}

// registerTerminalPages is the browser side of the gateway: the terminal's
// WebSocket and the page that watches a command.
func (s *Server) registerTerminalPages(pg *group) {
	pg.handle(http.MethodGet, "/sessions/:id/terminal", rbac.Authenticated(), s.wsTerminal)
	pg.handle(http.MethodGet, "/sessions/:id/commands/:cid/watch", rbac.Authenticated(), s.pageWatch)
}

// terminalOrg is the request's org as the gateway needs it.
func (s *Server) terminalOrg(c echo.Context) gateway.Org {
	t := tenantOf(c)
	return gateway.Org{Slug: t.Org.Slug, DB: t.DB, Audit: t.Audit, Sessions: s.sessionService(c), Revoked: t.Context()}
}

func meta(c echo.Context) gateway.Meta {
	return gateway.Meta{SourceIP: c.RealIP(), UserAgent: c.Request().UserAgent()}
}

func (s *Server) apiExec(c echo.Context) error {
	sid, err := idParam(c, "id")
	if err != nil {
		return err
	}
	var req gateway.ExecRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	// Checked before anything is recorded: a refused exec leaves no
	// command and no audit record, and reaches no agentd.
	if err := req.Validate(); err != nil {
		return err
	}
	out, err := s.Gateway.Exec(c.Request().Context(), s.terminalOrg(c), actorOf(c), meta(c), sid, req)
	if err != nil {
		return err
	}
	if out.Approval != nil {
		// Held for a person: nothing ran (docs/agents.md#approvals).
		return c.JSON(http.StatusAccepted, map[string]any{"approval": out.Approval})
	}
	return c.JSON(http.StatusCreated, out)
}

// commandJSON is a command as the history shows it.
type commandJSON struct {
	ID        int64   `json:"id"`
	SessionID int64   `json:"session_id"`
	Command   string  `json:"command"`
	Cwd       string  `json:"cwd"`
	TTY       bool    `json:"tty"`
	StartedBy string  `json:"started_by"`
	StartedAt string  `json:"started_at"`
	EndedAt   *string `json:"ended_at"`
	State     string  `json:"state"`
	ExitCode  *int    `json:"exit_code"`
	Reason    string  `json:"reason,omitempty"`
	// EndedBy is "session_close" for a command its session's close ended.
	EndedBy      string `json:"ended_by,omitempty"`
	DurationMS   *int64 `json:"duration_ms"`
	OutputBytes  int64  `json:"output_bytes"`
	InputBytes   int64  `json:"input_bytes"`
	DroppedBytes int64  `json:"dropped_bytes"`
	Truncated    bool   `json:"truncated"`
}

func toCommandJSON(cmd recordings.Command) commandJSON {
	j := commandJSON{ID: cmd.ID, SessionID: cmd.SessionID, Command: cmd.Command, Cwd: cmd.Cwd, TTY: cmd.TTY, StartedBy: cmd.ActorName,
		StartedAt: cmd.StartedAt.UTC().Format("2006-01-02T15:04:05.000Z07:00"), State: cmd.State, ExitCode: cmd.ExitCode, Reason: cmd.Reason,
		OutputBytes: cmd.OutBytes, InputBytes: cmd.InBytes, DroppedBytes: cmd.DroppedBytes, Truncated: cmd.Truncated}
	if cmd.EndedAt != nil {
		e := cmd.EndedAt.UTC().Format("2006-01-02T15:04:05.000Z07:00")
		d := cmd.EndedAt.Sub(cmd.StartedAt).Milliseconds()
		j.EndedAt, j.DurationMS = &e, &d
	}
	if cmd.Ended() && recordings.EndedBySessionClose(cmd.Reason) {
		j.EndedBy = "session_close"
	}
	return j
}

func (s *Server) apiCommands(c echo.Context) error {
	sid, err := idParam(c, "id")
	if err != nil {
		return err
	}
	f := recordings.Filter{SessionID: sid, State: c.QueryParam("state")}
	if v := c.QueryParam("before"); v != "" {
		if f.Before, err = strconv.ParseInt(v, 10, 64); err != nil || f.Before < 1 {
			return &apperr.ValidationError{Fields: map[string]string{"before": "before must be a command id."}}
		}
	}
	if v := c.QueryParam("limit"); v != "" {
		if f.Limit, err = strconv.Atoi(v); err != nil || f.Limit < 1 || f.Limit > 200 {
			return &apperr.ValidationError{Fields: map[string]string{"limit": "limit must be from 1 to 200."}}
		}
	}
	switch f.State {
	case "", recordings.StateRunning, recordings.StateExited, recordings.StateTimedOut, recordings.StateKilled, recordings.StateLost:
	default:
		return &apperr.ValidationError{Fields: map[string]string{"state": "state must be running, exited, timed_out, killed or lost."}}
	}
	cmds, err := s.Gateway.Commands(c.Request().Context(), s.terminalOrg(c), actorOf(c), f)
	if err != nil {
		return err
	}
	out := make([]commandJSON, len(cmds))
	for i, cmd := range cmds {
		out[i] = toCommandJSON(cmd)
	}
	resp := map[string]any{"items": out}
	if f.Limit == 0 {
		f.Limit = 50
	}
	if len(cmds) == f.Limit {
		resp["next_before"] = cmds[len(cmds)-1].ID
	}
	return c.JSON(http.StatusOK, resp)
}

// commandParams reads the session and command ids of the path.
func commandParams(c echo.Context) (int64, int64, error) {
	sid, err := idParam(c, "id")
	if err != nil {
		return 0, 0, err
	}
	cid, err := idParam(c, "cid")
	return sid, cid, err
}

func uintQuery(c echo.Context, name string) (int64, error) {
	v := c.QueryParam(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, &apperr.ValidationError{Fields: map[string]string{name: name + " must be a whole number, 0 or more."}}
	}
	return n, nil
}

func (s *Server) apiOutput(c echo.Context) error {
	sid, cid, err := commandParams(c)
	if err != nil {
		return err
	}
	cursor, err := uintQuery(c, "cursor")
	if err != nil {
		return err
	}
	wait, err := uintQuery(c, "wait_ms")
	if err != nil {
		return err
	}
	// A long-poll ends as soon as its credential is revoked or its reader
	// may no longer read the session's output, with why. A poll that does
	// not wait was checked as it came in: no watcher.
	ctx := c.Request().Context()
	if wait > 0 {
		var stop func()
		ctx, stop = gateway.WatchPrincipal(ctx, s.outputRecheck(c, sid))
		defer stop()
	}
	out, err := s.Gateway.Poll(ctx, s.terminalOrg(c), actorOf(c), sid, cid, uint64(cursor), wait)
	if err != nil {
		return err
	}
	// The answer's form follows Accept: caches must tell them apart.
	c.Response().Header().Add("Vary", "Accept")
	if agentd.WantsChunks(c.Request()) {
		// agentd's binary framing: bulk output without base64 and JSON
		// string scanning, for clients that ask for it as they would ask
		// agentd.
		chunks := out.Chunks
		out.Chunks = []agentd.Chunk{}
		return agentd.WriteChunks(c.Response(), out, chunks)
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) apiStdin(c echo.Context) error {
	sid, cid, err := commandParams(c)
	if err != nil {
		return err
	}
	var req agentd.StdinRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if len(req.Data) > 0 && req.Text != "" {
		return &apperr.ValidationError{Fields: map[string]string{"data": "Send either data (base64) or text, not both."}}
	}
	data := req.Data
	if req.Text != "" {
		data = []byte(req.Text)
	}
	if err := s.Gateway.Stdin(c.Request().Context(), s.terminalOrg(c), actorOf(c), meta(c), sid, cid, data, req.EOF); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) apiResize(c echo.Context) error {
	sid, cid, err := commandParams(c)
	if err != nil {
		return err
	}
	var req agentd.ResizeRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if req.Rows == 0 || req.Cols == 0 || req.Rows > 4096 || req.Cols > 4096 {
		return &apperr.ValidationError{Fields: map[string]string{"rows": "rows and cols must be from 1 to 4096."}}
	}
	if err := s.Gateway.Resize(c.Request().Context(), s.terminalOrg(c), actorOf(c), meta(c), sid, cid, req.Rows, req.Cols); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) apiKill(c echo.Context) error {
	sid, cid, err := commandParams(c)
	if err != nil {
		return err
	}
	out, err := s.Gateway.Kill(c.Request().Context(), s.terminalOrg(c), actorOf(c), meta(c), sid, cid)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) apiReadFile(c echo.Context) error {
	sid, err := idParam(c, "id")
	if err != nil {
		return err
	}
	p := c.QueryParam("path")
	if p == "" {
		return &apperr.ValidationError{Fields: map[string]string{"path": "Give the path of the file to read."}}
	}
	offset, err := uintQuery(c, "offset")
	if err != nil {
		return err
	}
	limit, err := uintQuery(c, "limit")
	if err != nil {
		return err
	}
	f, err := s.Gateway.ReadFile(c.Request().Context(), s.terminalOrg(c), actorOf(c), meta(c), sid, p, offset, limit)
	if err != nil {
		return err
	}
	defer f.Body.Close()
	// The bytes are passed on as agentd sends them, never held whole:
	// concurrent large reads cost the console a copy buffer each.
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, echo.MIMEOctetStream)
	h.Set(agentd.FileHeaderSize, strconv.FormatInt(f.Size, 10))
	if f.Length >= 0 {
		h.Set(echo.HeaderContentLength, strconv.FormatInt(f.Length, 10))
	}
	c.Response().WriteHeader(http.StatusOK)
	if n, err := gateway.CopyFile(c.Response(), f.Body); err != nil {
		// The status is sent: the only way left to say the body is
		// incomplete is to break the response, so that no client takes
		// a cut file (sent without a length) for a whole one.
		s.Logger.Warn("file read ended early", "org", tenantOf(c).Org.Slug, "session", sid, "bytes", n, "error", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

// apiWriteFile writes the raw request body (at most gateway.MaxWriteBytes,
// exempt from the 1 MiB limit of JSON bodies) to path in the session's
// environment.
func (s *Server) apiWriteFile(c echo.Context) error {
	sid, err := idParam(c, "id")
	if err != nil {
		return err
	}
	req := gateway.WriteRequest{Path: c.QueryParam("path"), Body: c.Request().Body,
		ReadDeadline: http.NewResponseController(c.Response()).SetReadDeadline}
	if m := c.QueryParam("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil { // bits past 0777 are refused by the gateway's own check
			return &apperr.ValidationError{Fields: map[string]string{"mode": "mode must be octal permission bits from 0000 to 0777, such as 0644."}}
		}
		req.Mode = os.FileMode(v)
	}
	res, err := s.Gateway.WriteFile(c.Request().Context(), s.terminalOrg(c), actorOf(c), meta(c), sid, req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, res)
}

func (s *Server) apiStat(c echo.Context) error {
	sid, err := idParam(c, "id")
	if err != nil {
		return err
	}
	return jsonCall(c, http.StatusOK, func(req agentd.StatRequest) (agentd.StatResponse, error) {
		if len(req.Paths) == 0 || len(req.Paths) > 1024 {
			return agentd.StatResponse{}, &apperr.ValidationError{Fields: map[string]string{"paths": "Give 1 to 1024 paths."}}
		}
		res, err := s.Gateway.Stat(c.Request().Context(), s.terminalOrg(c), actorOf(c), meta(c), sid, req.Paths)
		return agentd.StatResponse{Results: res}, err
	})
}

func (s *Server) apiFetch(c echo.Context) error {
	sid, err := idParam(c, "id")
	if err != nil {
		return err
	}
	return jsonCall(c, http.StatusOK, func(req agentd.FetchRequest) (*agentd.FetchResponse, error) {
		// The gateway checks the URL, path, size and timeout before the
		// fetch is audited or forwarded.
		return s.Gateway.Fetch(c.Request().Context(), s.terminalOrg(c), actorOf(c), meta(c), sid, req)
	})
}

type recordingSettings struct {
	StdinContent *bool `json:"stdin_content"`
}

func (s *Server) apiRecordingSettings(c echo.Context) error {
	on, err := recordings.StdinContent(c.Request().Context(), tenantOf(c).DB)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, recordingSettings{StdinContent: &on})
}

// apiSetRecordingSettings chooses whether what is typed into commands is
// recorded or only its size; the change is audited with the change.
func (s *Server) apiSetRecordingSettings(c echo.Context) error {
	return jsonCall(c, http.StatusOK, func(req recordingSettings) (recordingSettings, error) {
		if req.StdinContent == nil {
			return req, &apperr.ValidationError{Fields: map[string]string{"stdin_content": "Say whether stdin content is recorded (true) or only its size (false)."}}
		}
		ctx := c.Request().Context()
		err := s.mutate(c, func(m *orgTx) error {
			before, err := recordings.StdinContent(ctx, m.tx)
			if err != nil {
				return err
			}
			if err := recordings.SetStdinContent(ctx, m.tx, *req.StdinContent); err != nil {
				return err
			}
			return m.audit("settings.recordings", auditTargetSettings(), map[string]any{"before": map[string]bool{"stdin_content": before},
				"after": map[string]bool{"stdin_content": *req.StdinContent}})
		})
		s.Gateway.SettingsChanged(tenantOf(c).Org.Slug)
		return req, err
	})
}

func auditTargetSettings() audit.Target {
	return audit.Target{Type: "settings", ID: "recordings", Name: "recording settings"}
}

// commandRows is a session's latest commands for its page, read as the
// API reads them: a viewer a rule refuses terminal reads sees none (the
// refusal is audited like any other).
// refused reports a viewer a rule refuses terminal reads: the page then
// neither looks for their shell nor follows the session live, each of
// which would read (and audit the refusal) again.
func (s *Server) commandRows(c echo.Context, sessionID int64) (rows []views.CommandRow, refused bool, err error) {
	cmds, err := s.Gateway.Commands(c.Request().Context(), s.terminalOrg(c), actorOf(c), recordings.Filter{SessionID: sessionID, Limit: 50})
	if errors.Is(err, apperr.ErrForbidden) {
		return nil, true, nil
	}
	if errors.Is(err, apperr.ErrConflict) {
		return nil, false, nil // nothing ran yet (a pending session)
	}
	if err != nil {
		return nil, false, err
	}
	rows = make([]views.CommandRow, len(cmds))
	for i, cmd := range cmds {
		rows[i] = commandRow(cmd)
	}
	return rows, false, nil
}

// isShell reports whether cmd is an interactive terminal a browser opened
// (or an API client opened as one): the shell's script on a TTY.
func isShell(cmd recordings.Command) bool { return cmd.TTY && cmd.Command == terminal.ShellCommand }

// commandRow is a command as pages list it.
func commandRow(cmd recordings.Command) views.CommandRow {
	j := toCommandJSON(cmd)
	r := views.CommandRow{ID: cmd.ID, Command: cmd.Command, StartedBy: cmd.ActorName, Started: views.When(cmd.StartedAt), State: cmd.State,
		ExitCode: "—", Duration: "—", Output: views.Bytes(cmd.OutBytes), TTY: cmd.TTY, Reason: cmd.Reason,
		Shell: isShell(cmd), EndedWithSession: j.EndedBy == "session_close"}
	if cmd.ExitCode != nil {
		r.ExitCode = strconv.Itoa(*cmd.ExitCode)
	}
	// Closing a shell kills it (137, or lost with the session): that is
	// how a shell ends normally, not a failure.
	if r.Shell && (cmd.State == recordings.StateKilled || r.EndedWithSession) {
		r.Closed, r.ExitCode = true, "closed"
	}
	if j.DurationMS != nil {
		r.Duration = (time.Duration(*j.DurationMS) * time.Millisecond).String()
	}
	return r
}
