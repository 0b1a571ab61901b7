package handlers

import (
	"fmt"
	"net/http"
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

func (s *Server) apiPlatformAudit(c echo.Context) error {
	before, limit, err := beforeParam(c)
	if err != nil {
		return err
	}
	evs, err := s.PlatformAudit.Recent(c.Request().Context(), before, limit)
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
	before, limit, err := beforeParam(c)
	if err != nil {
		return err
	}
	evs, err := s.PlatformAudit.Recent(c.Request().Context(), before, limit)
	if err != nil {
		return err
	}
	ap := views.AuditPage{Heading: "Platform audit log", Rows: auditRows(evs), Action: "/admin/audit"}
	if len(evs) == limit {
		ap.NextURL = fmt.Sprintf("/admin/audit?before=%d", evs[len(evs)-1].Seq)
	}
	if before > 0 {
		ap.FirstURL = "/admin/audit"
	}
	return render(c, http.StatusOK, views.AuditLog(s.page(c, "Platform audit log"), ap))
}
