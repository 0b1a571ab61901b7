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

// auditQuery is one run of an audit page's search: the search (with the
// date inputs folded in), its filter, the page asked for and the events,
// and for pages how many events match in all.
type auditQuery struct {
	Q      string
	Filter audit.Filter
	Before int64
	Limit  int
	Events []audit.Event
	// Count and CountMore are the page's match count (Counted when read).
	Count     int
	CountMore bool
	Counted   bool
}

// queryAudit runs ?q= with keyset paging against log for the JSON API and
// records, through record, that the log was read. It returns every match,
// reads of the log included.
func (s *Server) queryAudit(c echo.Context, log *audit.Log, record auditRecorder) (auditQuery, error) {
	aq, err := parseAuditQuery(c)
	if err != nil {
		return aq, err
	}
	if aq.Events, err = log.Query(c.Request().Context(), aq.Filter, aq.Before, aq.Limit); err != nil {
		return aq, err
	}
	if aq.Events == nil {
		aq.Events = []audit.Event{}
	}
	return aq, record(c, "audit.view", audit.Target{Type: "audit_log"}, map[string]any{"q": aq.Q, "before": aq.Before})
}

// searchAuditPage is queryAudit for a review page: reads of the log are
// left out unless the search names an action (action:audit. finds them),
// and the list and its count come from one read of the log, taken before
// this search's own audit.view is recorded.
func (s *Server) searchAuditPage(c echo.Context, log *audit.Log, record auditRecorder) (auditQuery, error) {
	aq, err := parseAuditQuery(c)
	if err != nil {
		return aq, err
	}
	aq.Filter.OmitReads = aq.Filter.Action == ""
	aq.Events, aq.Count, aq.CountMore, err = log.Search(c.Request().Context(), aq.Filter, aq.Before, aq.Limit, auditCountLimit)
	if err != nil {
		return aq, err
	}
	aq.Counted = true
	return aq, record(c, "audit.view", audit.Target{Type: "audit_log"}, map[string]any{"q": aq.Q, "before": aq.Before})
}

// parseAuditQuery reads ?q= (with the date inputs), ?before= and ?limit=.
func parseAuditQuery(c echo.Context) (auditQuery, error) {
	mergeDateParams(c)
	aq := auditQuery{Q: c.QueryParam("q")}
	var err error
	if aq.Filter, err = audit.ParseQuery(aq.Q); err != nil {
		return aq, err
	}
	aq.Before, aq.Limit, err = beforeParam(c)
	return aq, err
}

// auditRecorder appends an allowed action of the request's principal to
// one audit log: s.audited for the org's, s.platformAudited for the
// platform's.
type auditRecorder func(c echo.Context, action string, target audit.Target, details any) error

// platformAudited records an allowed action of the request's principal in
// the platform log.
func (s *Server) platformAudited(c echo.Context, action string, target audit.Target, details any) error {
	return s.platformEvent(c, principalOf(c).AuditActor(), action, target, audit.Allow, details)
}

// auditJSON answers an audit API query, with the cursor of the next page
// when this one is full.
func auditJSON(c echo.Context, aq auditQuery, err error) error {
	if err != nil {
		return err
	}
	resp := auditPageJSON{Items: aq.Events}
	if len(aq.Events) == aq.Limit {
		resp.NextBefore = aq.Events[len(aq.Events)-1].Seq
	}
	return c.JSON(http.StatusOK, resp)
}

func (s *Server) apiPlatformAudit(c echo.Context) error {
	aq, err := s.queryAudit(c, s.PlatformAudit, s.platformAudited)
	return auditJSON(c, aq, err)
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
	aq, err := s.searchAuditPage(c, s.PlatformAudit, s.platformAudited)
	q := aq.Q
	if err != nil {
		if fields, status, ok := formFailure(err); ok {
			ap := views.AuditPage{Heading: "Platform audit log", Action: "/admin/audit", FilterError: firstNonEmpty(fields["q"], fields["form"])}
			auditSearch(&ap, q, auditQuery{})
			return render(c, status, views.AuditLog(s.page(c, "Platform audit log"), ap))
		}
		return err
	}
	ap := views.AuditPage{Heading: "Platform audit log", Query: q, Rows: auditRows(aq.Events), Action: "/admin/audit",
		VerifyURL: "/admin/audit/verify", Export: []views.NavItem{
			{Label: "JSONL", Href: "/admin/audit/export?format=jsonl&q=" + url.QueryEscape(q)},
			{Label: "CSV", Href: "/admin/audit/export?format=csv&q=" + url.QueryEscape(q)},
		}}
	if len(aq.Events) == aq.Limit {
		ap.NextURL = fmt.Sprintf("/admin/audit?q=%s&before=%d", url.QueryEscape(q), aq.Events[len(aq.Events)-1].Seq)
	}
	if aq.Before > 0 {
		ap.FirstURL = "/admin/audit?q=" + url.QueryEscape(q)
	}
	auditSearch(&ap, q, aq)
	return render(c, http.StatusOK, views.AuditLog(s.page(c, "Platform audit log"), ap))
}

func (s *Server) apiPlatformAuditExport(c echo.Context) error {
	return s.exportLog(c, s.PlatformAudit, "platform", func(q, format string) error {
		return s.platformAudited(c, "audit.export", audit.Target{Type: "audit_log"}, map[string]any{"q": q, "format": format})
	})
}

// verifyPlatformAudit checks the platform chain and records that it did.
func (s *Server) verifyPlatformAudit(c echo.Context) (audit.VerifyResult, error) {
	res, err := s.PlatformAudit.Verify(c.Request().Context())
	if err != nil {
		return res, err
	}
	return res, s.platformAudited(c, "audit.verify", audit.Target{Type: "audit_log"}, res)
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
// inputs, the rest in the search box, and the count aq read.
func auditSearch(ap *views.AuditPage, q string, aq auditQuery) {
	ap.Query, ap.From, ap.To = audit.SplitDates(q)
	ap.Count, ap.CountMore, ap.Counted = aq.Count, aq.CountMore, aq.Counted
	ap.ReadsOmitted = aq.Filter.OmitReads
}

// verifyMessage says what a verification found, for pages.
func verifyMessage(res audit.VerifyResult) string {
	if !res.OK && res.BrokenAt == 0 {
		return "Verification failed: " + res.Reason + "."
	}
	if !res.OK {
		return fmt.Sprintf("Chain broken at sequence %d: %s", res.BrokenAt, res.Reason)
	}
	return fmt.Sprintf("Chain intact: %d events verified.", res.Checked)
}
