package handlers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/views"
)

// sessionService binds the sessions domain to the request's org and the
// process's session runtime (its hot-path cache).
func (s *Server) sessionService(c echo.Context) *sessions.Service {
	return s.sessionServiceOn(c, tenantOf(c).DB)
}

// sessionServiceOn is sessionService on a given handle (a transaction);
// the process cache stays keyed by the org's pool, which every transaction
// of the org shares.
func (s *Server) sessionServiceOn(c echo.Context, db *gorm.DB) *sessions.Service {
	e := s.envServiceOn(c, db)
	return &sessions.Service{DB: db, Pool: tenantOf(c).DB, Envs: e, Agents: &agents.Service{DB: db, Envs: e}, Org: tenantOf(c).Org.Slug,
		Audit: tenantOf(c).Audit, RT: s.SessionsRT,
		Decorate: func(ev *audit.Event) { ev.SourceIP, ev.UserAgent = c.RealIP(), c.Request().UserAgent() }}
}

type sessionJSON struct {
	ID            int64      `json:"id"`
	AgentID       int64      `json:"agent_id"`
	AgentName     string     `json:"agent_name"`
	UserID        *int64     `json:"user_id"`
	CreatedBy     string     `json:"created_by"`
	EnvironmentID *int64     `json:"environment_id"`
	TemplateID    *int64     `json:"template_id"`
	SandboxMode   string     `json:"sandbox_mode"`
	State         string     `json:"state"`
	Reason        string     `json:"reason"`
	SandboxID     string     `json:"sandbox_id"`
	BackendState  string     `json:"backend_state"`
	BackendSeenAt *time.Time `json:"backend_seen_at"`
	Workspace     string     `json:"workspace"`
	CreatedAt     time.Time  `json:"created_at"`
	StartedAt     *time.Time `json:"started_at"`
	LastUsedAt    *time.Time `json:"last_used_at"`
	ClosedAt      *time.Time `json:"closed_at"`
	// UnreachableSince is when the session's environment stopped
	// answering (null while it answers); past the unreachable window the
	// session is lost.
	UnreachableSince *time.Time `json:"unreachable_since"`
	// Preparation is what was put in the session's workspace and proven
	// there (one session's answers only; absent when nothing was ever
	// prepared).
	Preparation *preparationJSON `json:"preparation,omitempty"`
	// AgentdToken says which token the session's sandbox agentd takes:
	// "per_sandbox" (its own, given right after it was created),
	// "template" (its agentd is too old to be given one, so the
	// template's, shared by its every sandbox, opens it), or "" (a host
	// session, or no sandbox yet). Never the token itself.
	AgentdToken string `json:"agentd_token"`
}

type preparationJSON struct {
	Status     string              `json:"status"`
	Reason     string              `json:"reason"`
	Items      []sessions.PrepItem `json:"items"`
	PreparedAt *time.Time          `json:"prepared_at"`
	UpdatedAt  time.Time           `json:"updated_at"`
}

// withPreparation adds the session's preparation to its answer.
func (s *Server) withPreparation(c echo.Context, j sessionJSON) (sessionJSON, error) {
	p, err := s.sessionService(c).Preparation(c.Request().Context(), actorOf(c), j.ID)
	if err != nil || p == nil {
		return j, err
	}
	items := p.Items
	if items == nil {
		items = []sessions.PrepItem{}
	}
	j.Preparation = &preparationJSON{Status: p.Status, Reason: p.Reason, Items: items, PreparedAt: utcPtr(p.PreparedAt), UpdatedAt: p.UpdatedAt.UTC()}
	return j, nil
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func toSessionJSON(x sessions.Session) sessionJSON {
	return sessionJSON{ID: x.ID, AgentID: x.AgentID, AgentName: x.AgentName, UserID: x.UserID, CreatedBy: x.CreatedBy,
		EnvironmentID: x.EnvironmentID, TemplateID: x.TemplateID, SandboxMode: x.SandboxMode, State: x.State, Reason: x.Reason,
		SandboxID: x.SandboxID, BackendState: x.BackendState, BackendSeenAt: utcPtr(x.BackendSeenAt), Workspace: x.Workspace,
		CreatedAt: x.CreatedAt.UTC(), StartedAt: utcPtr(x.StartedAt), LastUsedAt: utcPtr(x.LastUsedAt), ClosedAt: utcPtr(x.ClosedAt),
		UnreachableSince: utcPtr(x.UnreachableSince), AgentdToken: x.AgentdTokenKind}
}

// sessionFilter reads the list filters from the query string.
func sessionFilter(c echo.Context) (sessions.ListFilter, error) {
	v := apperr.Validation()
	f := sessions.ListFilter{State: c.QueryParam("state")}
	ints := map[string]*int64{"agent_id": &f.AgentID, "user_id": &f.UserID, "before": &f.Before}
	for name, dst := range ints {
		if raw := c.QueryParam(name); raw != "" {
			n, err := strconv.ParseInt(raw, 10, 64)
			if err != nil || n < 0 {
				v.Add(name, "%s must be a positive whole number.", name)
			}
			*dst = n
		}
	}
	if raw := c.QueryParam("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > 200 {
			v.Add("limit", "limit must be from 1 to 200.")
		}
		f.Limit = n
	}
	times := map[string]*time.Time{"created_after": &f.CreatedAfter, "created_before": &f.CreatedBefore}
	for name, dst := range times {
		if raw := c.QueryParam(name); raw != "" {
			t, err := time.Parse(time.RFC3339, raw)
			if err != nil {
				v.Add(name, "%s must be an RFC 3339 time, like 2026-01-02T15:04:05Z.", name)
			}
			*dst = t
		}
	}
	return f, v.Err()
}

func (s *Server) apiListSessions(c echo.Context) error {
	f, err := sessionFilter(c)
	if err != nil {
		return err
	}
	p, err := s.sessionService(c).List(c.Request().Context(), actorOf(c), f)
	if err != nil {
		return err
	}
	out := make([]sessionJSON, len(p.Items))
	for i, x := range p.Items {
		out[i] = toSessionJSON(x)
	}
	resp := map[string]any{"items": out, "next": nil}
	if p.Next != 0 {
		resp["next"] = strconv.FormatInt(p.Next, 10)
	}
	return c.JSON(http.StatusOK, resp)
}

type sessionRequest struct {
	AgentID       int64  `json:"agent_id"`
	EnvironmentID *int64 `json:"environment_id"`
}

// createSession stores the session and its audit record together, in the
// service's own transaction: it checks (and counts against the caps) before
// the write, and keeps the write transaction to the rows it writes.
func (s *Server) createSession(c echo.Context, req sessionRequest) (sessions.Session, error) {
	ctx := c.Request().Context()
	return s.sessionService(c).Create(ctx, actorOf(c), sessions.CreateInput{AgentID: req.AgentID, EnvironmentID: req.EnvironmentID,
		Record: func(tx *gorm.DB, x sessions.Session) error {
			_, err := tenantOf(c).Audit.AppendTx(ctx, tx, requestEvent(c, principalOf(c).AuditActor(), "session.create", sessions.AuditTarget(x),
				audit.Allow, map[string]any{"after": toSessionJSON(x)}))
			return err
		}})
}

func (s *Server) apiCreateSession(c echo.Context) error {
	return jsonCall(c, http.StatusCreated, func(req sessionRequest) (sessionJSON, error) {
		x, err := s.createSession(c, req)
		return toSessionJSON(x), err
	})
}

func (s *Server) apiGetSession(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	x, err := s.sessionService(c).Get(c.Request().Context(), actorOf(c), id)
	if err != nil {
		return err
	}
	j, err := s.withPreparation(c, toSessionJSON(x))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, j)
}

// sessionOp is a lifecycle operation of the sessions service, such as
// (*sessions.Service).Pause.
type sessionOp func(*sessions.Service, context.Context, *authz.Actor, int64) (sessions.Session, error)

// runSessionOp runs a lifecycle operation on the :id session. Each one
// writes its state change and audit record in one transaction of its own,
// after the backend call: a backend call never runs inside a database
// transaction (on SQLite it would hold every writer back).
func (s *Server) runSessionOp(c echo.Context, op sessionOp) (sessions.Session, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return sessions.Session{}, err
	}
	return op(s.sessionService(c), c.Request().Context(), actorOf(c), id)
}

// closeSession closes a session (the API's DELETE and the page's close):
// the gateway first ends the commands running in it, killed and recorded
// to the end, then the sessions service closes it and kills its sandbox.
func (s *Server) closeSession(svc *sessions.Service, ctx context.Context, a *authz.Actor, id int64) (sessions.Session, error) {
	org := gateway.Org{Slug: svc.Org, DB: svc.DB, Audit: svc.Audit, Sessions: svc}
	left, err := s.Gateway.EndCommands(ctx, org, a, id)
	if err != nil {
		return sessions.Session{}, err
	}
	return svc.CloseLeaving(ctx, a, id, left)
}

// apiSessionOp answers a lifecycle operation with the session afterwards.
func (s *Server) apiSessionOp(op sessionOp) echo.HandlerFunc {
	return func(c echo.Context) error {
		x, err := s.runSessionOp(c, op)
		if err != nil {
			return err
		}
		j, err := s.withPreparation(c, toSessionJSON(x))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, j)
	}
}

// Session pages.

// sessionRows lists sessions for a page, naming their environments from
// byID (the environments the viewer may see, see visibleEnvsByID); a
// nil byID is read here.
func (s *Server) sessionRows(c echo.Context, list []sessions.Session, byID map[int64]envs.Environment) ([]views.SessionRow, error) {
	if byID == nil {
		var err error
		if byID, err = s.visibleEnvsByID(c); err != nil {
			return nil, err
		}
	}
	rows := make([]views.SessionRow, len(list))
	for i, x := range list {
		rows[i] = views.SessionRow{ID: x.ID, Agent: x.AgentName, User: x.CreatedBy, Environment: envLabel(byID, x.EnvironmentID),
			State: x.State, Reason: x.Reason, Created: views.When(x.CreatedAt)}
	}
	return rows, nil
}

func envLabel(byID map[int64]envs.Environment, id *int64) string {
	if id == nil {
		return "deleted"
	}
	if e, ok := byID[*id]; ok {
		return e.Name
	}
	return "#" + itoa(*id)
}

func (s *Server) pageSessions(c echo.Context) error {
	f, err := sessionFilter(c)
	if err != nil {
		return err
	}
	ctx, actor := c.Request().Context(), actorOf(c)
	p, err := s.sessionService(c).List(ctx, actor, f)
	if err != nil {
		return err
	}
	rows, err := s.sessionRows(c, p.Items, nil)
	if err != nil {
		return err
	}
	ags, err := s.agentService(c).List(ctx, actor)
	if err != nil {
		return err
	}
	d := views.SessionsData{Slug: tenantOf(c).Org.Slug, Rows: rows, State: f.State, AgentID: f.AgentID}
	for _, a := range ags {
		d.Agents = append(d.Agents, views.Option{Value: itoa(a.ID), Label: a.Name})
	}
	if p.Next != 0 {
		q := c.Request().URL.Query()
		q.Set("before", itoa(p.Next))
		d.NextURL = "/o/" + d.Slug + "/sessions?" + q.Encode()
	}
	return render(c, http.StatusOK, views.Sessions(s.orgPage(c, "Sessions"), d))
}

func (s *Server) pageCreateSession(c echo.Context) error {
	req := sessionRequest{AgentID: formInt64(c, "agent_id")}
	if env := formInt64(c, "environment_id"); env != 0 {
		req.EnvironmentID = &env
	}
	x, err := s.createSession(c, req)
	if fields, _, ok := formFailure(err); ok {
		s.setFlash(c, "The session was not created: "+fieldMessages(fields))
		return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/agents/"+itoa(req.AgentID))
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Session #"+itoa(x.ID)+" was created; its sandbox or workspace comes on first use.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/sessions/"+itoa(x.ID))
}

func fieldMessages(fields map[string]string) string {
	var msgs []string
	for _, m := range fields {
		msgs = append(msgs, m)
	}
	return strings.Join(msgs, " ")
}

func (s *Server) pageSession(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	ctx, actor, svc := c.Request().Context(), actorOf(c), s.sessionService(c)
	x, err := svc.Get(ctx, actor, id)
	if err != nil {
		return err
	}
	canUse, err := svc.CanUse(ctx, actor, x)
	if err != nil {
		return err
	}
	byID, err := s.visibleEnvsByID(c)
	if err != nil {
		return err
	}
	when := func(t *time.Time) string {
		if t == nil {
			return "—"
		}
		return views.When(*t)
	}
	d := views.SessionDetailData{Slug: tenantOf(c).Org.Slug, ID: x.ID, AgentID: x.AgentID, Agent: x.AgentName, User: x.CreatedBy,
		Environment: envLabel(byID, x.EnvironmentID), SandboxMode: x.SandboxMode, State: x.State, Reason: x.Reason,
		SandboxID: x.SandboxID, BackendState: x.BackendState, BackendSeen: when(x.BackendSeenAt), Workspace: x.Workspace,
		Created: views.When(x.CreatedAt), Started: when(x.StartedAt), LastUsed: when(x.LastUsedAt), Closed: when(x.ClosedAt), CanUse: canUse,
		AgentdToken: x.AgentdTokenKind}
	if x.UnreachableSince != nil && !x.Final() {
		d.Unreachable = when(x.UnreachableSince)
	}
	var refused bool
	if d.Commands, refused, err = s.commandRows(c, x.ID); err != nil {
		return err
	}
	d.Live = !refused && !x.Final()
	if d.Lifecycle, err = s.sessionLifecycle(c, x); err != nil {
		return err
	}
	if d.Preparation, err = s.preparationView(c, x.ID); err != nil {
		return err
	}
	if canUse && !x.Final() {
		td, err := s.sessionTerminal(c, x.ID, !refused)
		if err != nil {
			return err
		}
		d.Terminal = &td
		terminalCSP(c)
	}
	return render(c, http.StatusOK, views.SessionDetail(s.orgPage(c, "Session #"+itoa(x.ID)), d))
}

// sessionTerminal is the terminal of a session's page. ?terminal=N offers
// to attach to command N and ?terminal=new opens a new shell at once;
// otherwise, while the viewer's own interactive shell runs in the session
// (they reloaded the page, or came back to it), the page goes back to the
// newest one, from the start of what agentd still holds, and offers a new
// shell beside it (findShell false: the viewer may not read its commands).
// Anything else waits for "Open a terminal", so looking at a session
// starts nothing in it.
func (s *Server) sessionTerminal(c echo.Context, sessionID int64, findShell bool) (views.TerminalData, error) {
	newShell := sessionURLOf(c, sessionID) + "?terminal=new"
	switch v := c.QueryParam("terminal"); v {
	case "new":
		td := terminalData(c, sessionID, 0, false)
		td.Autostart = true
		return td, nil
	case "":
	default:
		attach, _ := strconv.ParseInt(v, 10, 64)
		td := terminalData(c, sessionID, attach, false)
		if attach != 0 {
			td.NewShellURL = newShell
		}
		return td, nil
	}
	if !findShell {
		return terminalData(c, sessionID, 0, false), nil
	}
	shell, err := s.runningShell(c, sessionID)
	if err != nil || shell == 0 {
		return terminalData(c, sessionID, 0, false), err
	}
	td := terminalData(c, sessionID, shell, false)
	td.Autostart, td.Reattach, td.NewShellURL = true, true, newShell
	return td, nil
}

// runningShell is the newest interactive shell the viewer opened in the
// session that is still running (0: none), read as the page's command
// list is: a viewer refused terminal reads has none to go back to.
func (s *Server) runningShell(c echo.Context, sessionID int64) (int64, error) {
	a := actorOf(c)
	cmds, err := s.Gateway.Commands(c.Request().Context(), s.terminalOrg(c), a,
		recordings.Filter{SessionID: sessionID, State: recordings.StateRunning, Limit: 50})
	if errors.Is(err, apperr.ErrForbidden) || errors.Is(err, apperr.ErrConflict) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	for _, cmd := range cmds { // newest first
		if isShell(cmd) && cmd.ActorType == a.Kind && cmd.ActorID == a.ID {
			return cmd.ID, nil
		}
	}
	return 0, nil
}

func sessionURLOf(c echo.Context, id int64) string {
	return "/o/" + tenantOf(c).Org.Slug + "/sessions/" + itoa(id)
}

// sessionLifecycle says when the session will pause and be reclaimed, from
// its agent's idle timeout and reclaim window (Timings: the viewer may read
// the session but not its agent).
func (s *Server) sessionLifecycle(c echo.Context, x sessions.Session) (string, error) {
	idle, reclaim, err := s.sessionService(c).Timings(c.Request().Context(), actorOf(c), x)
	if err != nil {
		return "", fmt.Errorf("read agent %d timeouts: %w", x.AgentID, err)
	}
	st := views.SessionTimes{SandboxMode: x.SandboxMode, State: x.State, LastUsed: x.CreatedAt, Idle: idle, Reclaim: reclaim}
	for _, t := range []*time.Time{x.StartedAt, x.LastUsedAt} {
		if t != nil && t.After(st.LastUsed) {
			st.LastUsed = *t
		}
	}
	return views.Lifecycle(st), nil
}

// preparationView is the session's preparation for its page.
func (s *Server) preparationView(c echo.Context, id int64) (*views.PreparationData, error) {
	p, err := s.sessionService(c).Preparation(c.Request().Context(), actorOf(c), id)
	if err != nil || p == nil || (p.Status == "" && len(p.Items) == 0) {
		return nil, err
	}
	d := &views.PreparationData{Status: p.Status, Reason: p.Reason}
	if p.PreparedAt != nil {
		d.Prepared = views.When(*p.PreparedAt)
	}
	for _, it := range p.Items {
		d.Items = append(d.Items, views.PrepItemRow{Kind: it.Kind, Name: it.Name, Source: it.Source, Path: it.Path, Size: it.Size,
			SHA256: it.SHA256, Status: it.Status, Error: it.Error})
	}
	return d, nil
}

// isNotPrepared reports a session whose workspace could not be prepared:
// its page shows why, with the retry.
func isNotPrepared(err error) bool {
	var ae *apperr.Error
	return errors.As(err, &ae) && ae.Code == "session_not_prepared"
}

// pageSessionOp runs a lifecycle operation from the session's page and
// returns to it with what happened.
func (s *Server) pageSessionOp(op sessionOp) echo.HandlerFunc {
	return func(c echo.Context) error {
		x, err := s.runSessionOp(c, op)
		if fields, _, ok := formFailure(err); ok {
			s.setFlash(c, fieldMessages(fields))
		} else if errors.Is(err, apperr.ErrUnavailable) || isNotPrepared(err) {
			// The environment or its backend failed (a sandbox that
			// would not start): the session's page says what happened
			// and what to do, rather than an error page.
			_, body := classify(err)
			s.setFlash(c, body.Message)
		} else if err != nil {
			return err
		} else {
			s.setFlash(c, "Session #"+itoa(x.ID)+" is "+x.State+".")
		}
		return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/sessions/"+url.PathEscape(c.Param("id")))
	}
}

// agentSessions is the sessions section of an agent's page: the newest
// sessions the actor may see, and a form to start one when allowed.
func (s *Server) agentSessions(c echo.Context, a agents.Agent, byID map[int64]envs.Environment) (views.AgentSessionsData, error) {
	ctx, actor, svc := c.Request().Context(), actorOf(c), s.sessionService(c)
	d := views.AgentSessionsData{Slug: tenantOf(c).Org.Slug, AgentID: a.ID}
	p, err := svc.List(ctx, actor, sessions.ListFilter{AgentID: a.ID, Limit: 10})
	if err != nil {
		return d, err
	}
	if d.Rows, err = s.sessionRows(c, p.Items, byID); err != nil {
		return d, err
	}
	if d.CanCreate, err = svc.CanCreate(ctx, actor, a); err != nil {
		return d, err
	}
	for _, id := range a.EnvironmentIDs {
		label := envLabel(byID, &id)
		if id == a.DefaultEnvironmentID {
			d.Envs = append([]views.Option{{Value: itoa(id), Label: label + " (default)"}}, d.Envs...)
			continue
		}
		d.Envs = append(d.Envs, views.Option{Value: itoa(id), Label: label})
	}
	return d, nil
}
