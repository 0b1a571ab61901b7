package handlers

import (
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/views"
)

func (s *Server) apiOrgAudit(c echo.Context) error {
	aq, err := s.queryAudit(c, tenantOf(c).Audit, s.audited)
	return auditJSON(c, aq, err)
}

// apiOrgAuditExport streams the filtered set as JSONL or CSV.
func (s *Server) apiOrgAuditExport(c echo.Context) error {
	t := tenantOf(c)
	return s.exportLog(c, t.Audit, t.Org.Slug, func(q, format string) error {
		if err := s.audited(c, "audit.export", audit.Target{Type: "audit_log"}, map[string]any{"q": q, "format": format}); err != nil {
			return err
		}
		s.checkpointAfter(c, t)
		return nil
	})
}

// exportLog streams log's events matching ?q= as ?format= (jsonl or csv),
// after record has audited the export itself.
func (s *Server) exportLog(c echo.Context, log *audit.Log, name string, record func(q, format string) error) error {
	format := c.QueryParam("format")
	if format == "" {
		format = "jsonl"
	}
	if format != "jsonl" && format != "csv" {
		return apperr.New(apperr.ErrInvalid, "bad_format", "format must be jsonl or csv.")
	}
	mergeDateParams(c)
	q := c.QueryParam("q")
	f, err := audit.ParseQuery(q)
	if err != nil {
		return err
	}
	if err := record(q, format); err != nil {
		return err
	}
	stamp := time.Now().UTC().Format("20060102T150405Z")
	if f.LeavesGaps() {
		stamp += "-filtered"
	}
	ct := "application/x-ndjson"
	if format == "csv" {
		ct = "text/csv; charset=utf-8"
	}
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, ct)
	h.Set(echo.HeaderContentDisposition, fmt.Sprintf(`attachment; filename="audit-%s-%s.%s"`, name, stamp, format))
	// The status goes out with the first rows (echo's Response commits on
	// the first Write): a failure before any row answers with an error
	// status; one after ends the body with audit's error marker.
	if err := log.Export(c.Request().Context(), f, c.Response(), format); err != nil {
		if !c.Response().Committed {
			h.Del(echo.HeaderContentDisposition)
			h.Del(echo.HeaderContentType)
			return err
		}
		s.Logger.Error("audit export failed", "log", name, "error", err)
	}
	return nil
}

func (s *Server) verifyAudit(c echo.Context) (audit.VerifyResult, error) {
	t := tenantOf(c)
	ctx := c.Request().Context()
	// The chain, and the recordings its command end events vouch for,
	// then whether it still holds what its checkpoints recorded.
	res, err := recordings.VerifyOrg(ctx, t.DB, t.Audit)
	if err != nil {
		return res, err
	}
	if res, err = s.Anchors.Verify(ctx, t.Org, t.Audit, res); err != nil {
		return res, err
	}
	if err := s.audited(c, "audit.verify", audit.Target{Type: "audit_log"}, res); err != nil {
		return res, err
	}
	s.checkpointAfter(c, t)
	return res, nil
}

func (s *Server) apiOrgAuditVerify(c echo.Context) error {
	res, err := s.verifyAudit(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, res)
}

func (s *Server) pageOrgAudit(c echo.Context) error {
	t := tenantOf(c)
	aq, err := s.searchAuditPage(c, t.Audit, s.audited)
	q := aq.Q
	if err != nil {
		if fields, status, ok := formFailure(err); ok {
			ap := views.AuditPage{Heading: "Audit log", Action: c.Request().URL.Path, FilterError: firstNonEmpty(fields["q"], fields["form"])}
			auditSearch(&ap, q, auditQuery{})
			return render(c, status, views.AuditLog(s.orgPage(c, "Audit log"), ap))
		}
		return err
	}
	base := "/o/" + t.Org.Slug + "/audit"
	rows := auditRows(aq.Events)
	if err := replayLinks(c.Request().Context(), t.DB, t.Org.Slug, aq.Events, rows); err != nil {
		return err
	}
	ap := views.AuditPage{Heading: "Audit log", Query: q, Rows: rows, Action: base,
		Export: []views.NavItem{
			{Label: "JSONL", Href: base + "/export?format=jsonl&q=" + url.QueryEscape(q)},
			{Label: "CSV", Href: base + "/export?format=csv&q=" + url.QueryEscape(q)},
		},
		VerifyURL: base + "/verify"}
	if len(aq.Events) == aq.Limit {
		ap.NextURL = fmt.Sprintf("%s?q=%s&before=%d", base, url.QueryEscape(q), aq.Events[len(aq.Events)-1].Seq)
	}
	if aq.Before > 0 {
		ap.FirstURL = base + "?q=" + url.QueryEscape(q)
	}
	auditSearch(&ap, q, aq)
	return render(c, http.StatusOK, views.AuditLog(s.orgPage(c, "Audit log"), ap))
}

func (s *Server) pageOrgAuditVerify(c echo.Context) error {
	res, err := s.verifyAudit(c)
	if err != nil {
		return err
	}
	s.setFlash(c, verifyMessage(res))
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/audit")
}
