package handlers

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/views"
)

type auditPageJSON struct {
	Items      []audit.Event `json:"items"`
	NextBefore int64         `json:"next_before,omitempty"`
}

func beforeParam(c echo.Context) (int64, int, error) {
	_, limit, err := pageParams(c)
	if err != nil {
		return 0, 0, err
	}
	var before int64
	if v := c.QueryParam("before"); v != "" {
		before, err = strconv.ParseInt(v, 10, 64)
		if err != nil || before < 1 {
			return 0, 0, apperr.New(apperr.ErrInvalid, "bad_cursor", "before must be a positive sequence number.")
		}
	}
	return before, limit, nil
}

// queryLog runs ?q= with keyset paging against log.
func queryLog(c echo.Context, log *audit.Log) ([]audit.Event, int64, int, error) {
	mergeDateParams(c)
	f, err := audit.ParseQuery(c.QueryParam("q"))
	if err != nil {
		return nil, 0, 0, err
	}
	before, limit, err := beforeParam(c)
	if err != nil {
		return nil, 0, 0, err
	}
	evs, err := log.Query(c.Request().Context(), f, before, limit)
	if evs == nil {
		evs = []audit.Event{}
	}
	return evs, before, limit, err
}

// queryPlatformAudit runs the query and records that the platform log was
// read, as reading an org's log is.
func (s *Server) queryPlatformAudit(c echo.Context) ([]audit.Event, int64, int, error) {
	evs, before, limit, err := queryLog(c, s.PlatformAudit)
	if err != nil {
		return nil, 0, 0, err
	}
	if err := s.platformEvent(c, principalOf(c).AuditActor(), "audit.view", audit.Target{Type: "audit_log"}, audit.Allow,
		map[string]any{"q": c.QueryParam("q"), "before": before}); err != nil {
		return nil, 0, 0, err
	}
	return evs, before, limit, nil
}

func (s *Server) apiPlatformAudit(c echo.Context) error {
	evs, _, limit, err := s.queryPlatformAudit(c)
	if err != nil {
		return err
	}
	resp := auditPageJSON{Items: evs}
	if len(evs) == limit {
		resp.NextBefore = evs[len(evs)-1].Seq
	}
	return c.JSON(http.StatusOK, resp)
}

func auditRows(evs []audit.Event) []views.AuditRow {
	rows := make([]views.AuditRow, len(evs))
	for i, e := range evs {
		target := e.Target.Type
		if e.Target.Name != "" || e.Target.ID != "" {
			target += " " + firstNonEmpty(e.Target.Name, e.Target.ID)
		}
		rows[i] = views.AuditRow{Seq: e.Seq, Time: e.Time, Actor: firstNonEmpty(e.Actor.Name, e.Actor.ID, "—"), ActorType: e.Actor.Type,
			SourceIP: e.SourceIP, Action: e.Action, Target: target, Decision: e.Decision, Details: string(e.Details)}
	}
	return rows
}

func firstNonEmpty(xs ...string) string {
	for _, x := range xs {
		if x != "" {
			return x
		}
	}
	return ""
}

func (s *Server) pagePlatformAudit(c echo.Context) error {
	mergeDateParams(c)
	q := c.QueryParam("q")
	evs, before, limit, err := s.queryPlatformAudit(c)
	if err != nil {
		if fields, status, ok := formFailure(err); ok {
			ap := views.AuditPage{Heading: "Platform audit log", Action: "/admin/audit", FilterError: firstNonEmpty(fields["q"], fields["form"])}
			s.auditSearch(c, nil, &ap, q)
			return render(c, status, views.AuditLog(s.page(c, "Platform audit log"), ap))
		}
		return err
	}
	ap := views.AuditPage{Heading: "Platform audit log", Query: q, Rows: auditRows(evs), Action: "/admin/audit",
		VerifyURL: "/admin/audit/verify", Export: []views.NavItem{
			{Label: "JSONL", Href: "/admin/audit/export?format=jsonl&q=" + url.QueryEscape(q)},
			{Label: "CSV", Href: "/admin/audit/export?format=csv&q=" + url.QueryEscape(q)},
		}}
	if len(evs) == limit {
		ap.NextURL = fmt.Sprintf("/admin/audit?q=%s&before=%d", url.QueryEscape(q), evs[len(evs)-1].Seq)
	}
	if before > 0 {
		ap.FirstURL = "/admin/audit?q=" + url.QueryEscape(q)
	}
	s.auditSearch(c, s.PlatformAudit, &ap, q)
	return render(c, http.StatusOK, views.AuditLog(s.page(c, "Platform audit log"), ap))
}

func (s *Server) apiPlatformAuditExport(c echo.Context) error {
	return s.exportLog(c, s.PlatformAudit, "platform", func(q, format string) error {
		return s.platformEvent(c, principalOf(c).AuditActor(), "audit.export", audit.Target{Type: "audit_log"}, audit.Allow,
			map[string]any{"q": q, "format": format})
	})
}

// verifyPlatformAudit checks the platform chain and records that it did.
func (s *Server) verifyPlatformAudit(c echo.Context) (audit.VerifyResult, error) {
	res, err := s.PlatformAudit.Verify(c.Request().Context())
	if err != nil {
		return res, err
	}
	return res, s.platformEvent(c, principalOf(c).AuditActor(), "audit.verify", audit.Target{Type: "audit_log"}, audit.Allow, res)
}

func (s *Server) apiPlatformAuditVerify(c echo.Context) error {
	res, err := s.verifyPlatformAudit(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, res)
}

func (s *Server) pagePlatformAuditVerify(c echo.Context) error {
	res, err := s.verifyPlatformAudit(c)
	if err != nil {
		return err
	}
	s.setFlash(c, verifyMessage(res))
	return c.Redirect(http.StatusSeeOther, "/admin/audit")
}

// auditCountLimit is where the audit pages stop counting matches.
const auditCountLimit = 1000

// mergeDateParams folds the audit pages' date inputs (?from=, ?to=) into
// the search (?q=), so every reader of q (the query, the audit record of
// the search, export and paging links) sees one search.
func mergeDateParams(c echo.Context) {
	qp := c.QueryParams()
	if qp.Get("from") == "" && qp.Get("to") == "" {
		return
	}
	qp.Set("q", audit.JoinDates(qp.Get("q"), qp.Get("from"), qp.Get("to")))
	qp.Del("from")
	qp.Del("to")
	c.Request().URL.RawQuery = qp.Encode()
}

// auditSearch shows the search q on an audit page: dates in the date
// inputs, the rest in the search box, and how many events match when log
// is given (nil when the search was refused).
func (s *Server) auditSearch(c echo.Context, log *audit.Log, ap *views.AuditPage, q string) {
	ap.Query, ap.From, ap.To = audit.SplitDates(q)
	if log == nil {
		return
	}
	f, err := audit.ParseQuery(q)
	if err != nil {
		return
	}
	n, more, err := log.Count(c.Request().Context(), f, auditCountLimit)
	if err != nil {
		// The page is still useful without its count.
		s.Logger.Warn("audit count failed", "error", err)
		return
	}
	ap.Count, ap.CountMore, ap.Counted = n, more, true
}

// verifyMessage says what a verification found, for pages.
func verifyMessage(res audit.VerifyResult) string {
	if !res.OK {
		return fmt.Sprintf("Chain broken at sequence %d: %s", res.BrokenAt, res.Reason)
	}
	return fmt.Sprintf("Chain intact: %d events verified.", res.Checked)
}
