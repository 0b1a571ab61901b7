package handlers

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/anchor"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/tenant"
)

// checkpointAfter anchors the org's head after a verify or an export,
// including the record of it. A failure is logged, not answered: the
// verification or export stands, and the loop takes a checkpoint within
// a minute.
func (s *Server) checkpointAfter(c echo.Context, t *tenant.Tenant) {
	res, err := s.Anchors.Take(c.Request().Context(), t.Org, t.Audit)
	if err != nil {
		s.Logger.Warn("audit checkpoint not taken", "org", t.Org.Slug, "request_id", requestID(c), "error", err)
		return
	}
	if res.Mismatch != nil {
		s.Logger.Error("audit log no longer holds its newest checkpoint", "org", t.Org.Slug, "reason", res.Mismatch.Reason)
	}
	if res.Forged != nil {
		s.Logger.Error("the newest audit checkpoint does not verify or a newer one was deleted", "org", t.Org.Slug, "reason", res.Forged.Reason)
	}
}

// apiOrgCheckpoint takes a checkpoint of the org's head and answers the
// newest one with its public key, for an auditor to keep outside the
// system and check the log, or an export of it, against later.
func (s *Server) apiOrgCheckpoint(c echo.Context) error {
	t := tenantOf(c)
	if err := s.audited(c, anchor.ExportAction, audit.Target{Type: "audit_log"}, nil); err != nil {
		return err
	}
	res, err := s.Anchors.Take(c.Request().Context(), t.Org, t.Audit)
	if err != nil {
		return err
	}
	return s.sendCheckpoint(c, t.Org, res.Mismatch)
}

// apiPlatformOrgCheckpoint is apiOrgCheckpoint for platform admins, who
// need not enter the org. A suspended org's database is closed and its
// head cannot move: its newest checkpoint is answered as it is.
func (s *Server) apiPlatformOrgCheckpoint(c echo.Context) error {
	ctx := c.Request().Context()
	o, err := s.Orgs.Get(ctx, c.Param("org"))
	if err != nil {
		return err
	}
	if err := s.platformAudited(c, anchor.ExportAction, audit.Target{Type: "organization", ID: o.Slug, Name: o.Name}, nil); err != nil {
		return err
	}
	t, err := s.Tenants.Open(ctx, o.Slug)
	if errors.Is(err, apperr.ErrSuspended) {
		return s.sendCheckpoint(c, o, nil)
	}
	if err != nil {
		return err
	}
	defer t.Release()
	res, err := s.Anchors.Take(ctx, t.Org, t.Audit)
	if err != nil {
		return err
	}
	return s.sendCheckpoint(c, t.Org, res.Mismatch)
}

// sendCheckpoint answers the org's newest checkpoint as a JSON download;
// mismatch, when set, is said in its unsigned warning. A newest checkpoint
// that does not verify, or one older than the newest the platform log
// recorded, is refused by Export (409), never answered.
func (s *Server) sendCheckpoint(c echo.Context, o orgs.Org, mismatch *audit.AnchorCheck) error {
	exp, err := s.Anchors.Export(c.Request().Context(), o)
	if errors.Is(err, anchor.ErrNone) {
		return apperr.New(apperr.ErrNotFound, "no_checkpoint", "Organization %q has no audit checkpoint yet.", o.Slug)
	}
	if err != nil {
		return err
	}
	if mismatch != nil {
		exp.Warning = "The audit log no longer holds what this checkpoint recorded, so no newer one was taken: " + mismatch.Reason
	}
	c.Response().Header().Set(echo.HeaderContentDisposition,
		fmt.Sprintf(`attachment; filename="audit-checkpoint-%s-%d.json"`, o.Slug, exp.Seq))
	return c.JSON(http.StatusOK, exp)
}
