package handlers

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/views"
)

// registerApprovals is the approval queue: its JSON API and its page. Every
// signed-in principal reaches the routes; which requests it sees, decides
// or cancels is decided per request by internal/approvals (the agent's
// department's approvals:decide, never one's own request), hidden ones
// answering 404.
func (s *Server) registerApprovals(api, pg *group) {
	api.handle(http.MethodGet, "/approvals", rbac.Authenticated(), s.apiListApprovals)
	api.handle(http.MethodGet, "/approvals/:id", rbac.Authenticated(), s.apiGetApproval)
	api.handle(http.MethodPost, "/approvals/:id/decision", rbac.Authenticated(), s.apiDecideApproval)
	api.handle(http.MethodPost, "/approvals/:id/cancel", rbac.Authenticated(), s.apiCancelApproval)
	// The org's approval webhook: its settings, like the org's others.
	api.handle(http.MethodGet, "/approvals/webhook", rbac.Org("settings", "read"), s.apiGetApprovalWebhook)
	api.handle(http.MethodPut, "/approvals/webhook", rbac.Org("settings", "update"), s.apiPutApprovalWebhook)
	pg.handle(http.MethodGet, "/approvals", rbac.Authenticated(), s.pageApprovals)
	pg.handle(http.MethodPost, "/approvals/:id/decision", rbac.Authenticated(), s.pageDecideApproval)
	pg.handle(http.MethodPost, "/approvals/:id/cancel", rbac.Authenticated(), s.pageCancelApproval)
}

func (s *Server) approvalService(c echo.Context) *approvals.Service {
	t := tenantOf(c)
	svc := &approvals.Service{DB: t.DB, Audit: t.Audit, Org: t.Org.Slug, Notifier: s.ApprovalNotifier}
	if s.ApprovalQueue != nil {
		svc = s.ApprovalQueue(t)
	}
	svc.Now, svc.AddRule = s.Now, s.auditedApprovalRule(t)
	return svc
}

type approvalActorJSON struct {
	Type string `json:"type"`
	ID   string `json:"id"`
	Name string `json:"name"`
	Via  string `json:"via,omitempty"`
}

type approvalJSON struct {
	ID           int64              `json:"id"`
	State        string             `json:"state"`
	SessionID    int64              `json:"session_id"`
	AgentID      int64              `json:"agent_id"`
	DepartmentID *int64             `json:"department_id"`
	Command      string             `json:"command"`
	Cwd          string             `json:"cwd"`
	EnvNames     []string           `json:"env_names"`
	TTY          bool               `json:"tty"`
	Stdin        bool               `json:"stdin"`
	Rule         string             `json:"rule"`
	PolicyDigest string             `json:"policy_digest"`
	Digest       string             `json:"digest"`
	Requester    approvalActorJSON  `json:"requester"`
	ExpiresAt    time.Time          `json:"expires_at"`
	CreatedAt    time.Time          `json:"created_at"`
	DecidedAt    *time.Time         `json:"decided_at"`
	Decider      *approvalActorJSON `json:"decider"`
	Reason       string             `json:"reason"`
	Scope        string             `json:"scope"`
	GrantedBy    *int64             `json:"granted_by"`
	CommandID    *int64             `json:"command_id"`
}

func toApprovalJSON(a approvals.Approval) approvalJSON {
	out := approvalJSON{ID: a.ID, State: string(a.State), SessionID: a.SessionID, AgentID: a.AgentID, DepartmentID: a.DepartmentID,
		Command: a.Command, Cwd: a.Cwd, EnvNames: a.EnvNames, TTY: a.TTY, Stdin: a.Stdin, Rule: a.Rule, PolicyDigest: a.PolicyDigest,
		Digest: a.Digest, Requester: approvalActorJSON{Type: a.Requester.Type, ID: a.Requester.ID, Name: a.Requester.Name, Via: a.Requester.Via},
		ExpiresAt: a.ExpiresAt, CreatedAt: a.CreatedAt, DecidedAt: a.DecidedAt, Reason: a.Reason, Scope: string(a.Scope),
		GrantedBy: a.GrantedBy, CommandID: a.CommandID}
	if a.Decider.Type != "" {
		out.Decider = &approvalActorJSON{Type: a.Decider.Type, ID: a.Decider.ID, Name: a.Decider.Name}
	}
	return out
}

func approvalFilter(c echo.Context) (approvals.Filter, error) {
	v := apperr.Validation()
	f := approvals.Filter{State: approvals.State(c.QueryParam("state"))}
	if raw := c.QueryParam("before"); raw != "" {
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || n < 0 {
			v.Add("before", "before must be a positive whole number.")
		}
		f.Before = n
	}
	if raw := c.QueryParam("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > 200 {
			v.Add("limit", "limit must be from 1 to 200.")
		}
		f.Limit = n
	}
	return f, v.Err()
}

func (s *Server) apiListApprovals(c echo.Context) error {
	f, err := approvalFilter(c)
	if err != nil {
		return err
	}
	p, err := s.approvalService(c).List(c.Request().Context(), actorOf(c), f)
	if err != nil {
		return err
	}
	out := make([]approvalJSON, len(p.Items))
	for i, a := range p.Items {
		out[i] = toApprovalJSON(a)
	}
	resp := map[string]any{"items": out, "next": nil}
	if p.Next != 0 {
		resp["next"] = strconv.FormatInt(p.Next, 10)
	}
	return c.JSON(http.StatusOK, resp)
}

func (s *Server) apiGetApproval(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	a, err := s.approvalService(c).Get(c.Request().Context(), actorOf(c), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toApprovalJSON(a))
}

type decisionRequest struct {
	Decision string `json:"decision"`
	Scope    string `json:"scope"`
	Reason   string `json:"reason"`
}

func (s *Server) decide(c echo.Context, req decisionRequest) (approvals.Approval, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return approvals.Approval{}, err
	}
	return s.approvalService(c).Decide(c.Request().Context(), actorOf(c), id, approvals.Decision(req.Decision), approvals.Scope(req.Scope), req.Reason)
}

func (s *Server) apiDecideApproval(c echo.Context) error {
	return jsonCall(c, http.StatusOK, func(req decisionRequest) (approvalJSON, error) {
		a, err := s.decide(c, req)
		return toApprovalJSON(a), err
	})
}

func (s *Server) cancelApproval(c echo.Context) (approvals.Approval, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return approvals.Approval{}, err
	}
	return s.approvalService(c).Cancel(c.Request().Context(), actorOf(c), id)
}

func (s *Server) apiCancelApproval(c echo.Context) error {
	a, err := s.cancelApproval(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toApprovalJSON(a))
}

// pageApprovals lists the pending requests the caller may see first, then
// the most recent decided ones; the page follows the queue live.
func (s *Server) pageApprovals(c echo.Context) error {
	ctx, actor := c.Request().Context(), actorOf(c)
	svc := s.approvalService(c)
	pending, err := svc.List(ctx, actor, approvals.Filter{State: approvals.Pending, Limit: 200})
	if err != nil {
		return err
	}
	recent, err := svc.List(ctx, actor, approvals.Filter{Limit: 50})
	if err != nil {
		return err
	}
	d := views.ApprovalsData{Slug: tenantOf(c).Org.Slug}
	names, err := s.agentNames(ctx, c)
	if err != nil {
		return err
	}
	now := s.Now()
	for _, a := range pending.Items {
		r, err := s.approvalRow(ctx, svc, actor, a, names, now)
		if err != nil {
			return err
		}
		d.Pending = append(d.Pending, r)
	}
	for _, a := range recent.Items {
		if a.State == approvals.Pending {
			continue
		}
		r, err := s.approvalRow(ctx, svc, actor, a, names, now)
		if err != nil {
			return err
		}
		d.Decided = append(d.Decided, r)
	}
	return render(c, http.StatusOK, views.Approvals(s.orgPage(c, "Approvals"), d))
}

// agentNames maps the agents the caller may see to their names.
func (s *Server) agentNames(ctx context.Context, c echo.Context) (map[int64]string, error) {
	list, err := s.agentService(c).List(ctx, actorOf(c))
	if err != nil {
		return nil, err
	}
	out := make(map[int64]string, len(list))
	for _, a := range list {
		out[a.ID] = a.Name
	}
	return out, nil
}

func (s *Server) approvalRow(ctx context.Context, svc *approvals.Service, actor *authz.Actor, a approvals.Approval, names map[int64]string, now time.Time) (views.ApprovalRow, error) {
	r := views.ApprovalRow{ID: a.ID, Command: a.Command, AgentID: a.AgentID, Agent: names[a.AgentID], SessionID: a.SessionID,
		Requester: a.Requester.Name, Rule: a.Rule, State: string(a.State), Reason: a.Reason, Scope: string(a.Scope),
		Created: a.CreatedAt.Format(time.RFC3339)}
	if r.Agent == "" {
		r.Agent = "agent #" + strconv.FormatInt(a.AgentID, 10)
	}
	if a.Decider.Type != "" {
		r.Decider = a.Decider.Name
	}
	if a.State == approvals.Pending {
		r.ExpiresIn = a.ExpiresAt.Sub(now).Round(time.Second).String()
		ok, err := svc.CanDecide(ctx, actor, a)
		if err != nil {
			return r, err
		}
		own := a.RequestedBy(actor)
		r.CanDecide, r.CanCancel, r.Own = ok && !own, own, own
	}
	return r, nil
}

func (s *Server) pageDecideApproval(c echo.Context) error {
	req := decisionRequest{Decision: c.FormValue("decision"), Scope: c.FormValue("scope"), Reason: c.FormValue("reason")}
	a, err := s.decide(c, req)
	return s.approvalFormDone(c, a, err, "decided")
}

func (s *Server) pageCancelApproval(c echo.Context) error {
	a, err := s.cancelApproval(c)
	return s.approvalFormDone(c, a, err, "cancelled")
}

// approvalFormDone answers a decision or cancel form: back to the queue
// with what happened, or why not (bad input, a refusal, already decided),
// in the flash; a hidden request (404) takes the error page.
func (s *Server) approvalFormDone(c echo.Context, a approvals.Approval, err error, what string) error {
	back := "/o/" + tenantOf(c).Org.Slug + "/approvals"
	if fields, _, ok := formFailure(err); ok {
		s.setFlash(c, "The request was not "+what+": "+fieldMessages(fields))
		return c.Redirect(http.StatusSeeOther, back)
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Request #"+strconv.FormatInt(a.ID, 10)+" is "+string(a.State)+".")
	return c.Redirect(http.StatusSeeOther, back)
}

// pendingCount is the navigation's count of requests waiting for the
// caller's decision ("" for none, or when it cannot be read: the page
// itself was authorized, and a failed count only hides a number).
func (s *Server) pendingCount(c echo.Context) string {
	a := actorOf(c)
	if a == nil {
		return ""
	}
	n, err := s.approvalService(c).PendingCount(c.Request().Context(), a)
	if err != nil {
		s.Logger.Error("pending approvals count failed", "org", tenantOf(c).Org.Slug, "request_id", requestID(c), "error", err)
		return ""
	}
	if n == 0 {
		return ""
	}
	return strconv.FormatInt(n, 10)
}

// approvalWebhookJSON shows a webhook's origin only (its path may be a
// credential) and whether a path is set, and never the secret.
type approvalWebhookJSON struct {
	URL       string     `json:"url"`
	PathSet   bool       `json:"path_set"`
	SecretSet bool       `json:"secret_set"`
	UpdatedAt *time.Time `json:"updated_at"`
}

func toApprovalWebhookJSON(w approvals.WebhookConfig) approvalWebhookJSON {
	return approvalWebhookJSON{URL: w.URL, PathSet: w.PathSet, SecretSet: w.SecretSet, UpdatedAt: w.UpdatedAt}
}

func (s *Server) apiGetApprovalWebhook(c echo.Context) error {
	w, err := s.approvalService(c).GetWebhook(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toApprovalWebhookJSON(w))
}

type approvalWebhookRequest struct {
	URL    string `json:"url"`
	Secret string `json:"secret"`
}

func (s *Server) apiPutApprovalWebhook(c echo.Context) error {
	return jsonCall(c, http.StatusOK, func(req approvalWebhookRequest) (approvalWebhookJSON, error) {
		w, err := s.approvalService(c).SetWebhook(c.Request().Context(), principalOf(c).AuditActor(), s.Box, req.URL, req.Secret)
		return toApprovalWebhookJSON(w), err
	})
}
