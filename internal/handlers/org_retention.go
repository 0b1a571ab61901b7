package handlers

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/retention"
)

// registerRetention is the org's retention policy and the archives of the
// audit events retention removed (internal/retention applies the policy).
func (s *Server) registerRetention(api *group) {
	api.handle(http.MethodGet, "/settings/retention", rbac.Org("settings", "read"), s.apiRetention)
	api.handle(http.MethodPut, "/settings/retention", rbac.Org("settings", "update"), s.apiSetRetention)
	api.handle(http.MethodGet, "/audit/archives", rbac.Org("audit", "export"), s.apiAuditArchives)
	api.handle(http.MethodGet, "/audit/archives/:id", rbac.Org("audit", "export"), s.apiAuditArchive)
}

func (s *Server) apiRetention(c echo.Context) error {
	p, err := retention.Load(c.Request().Context(), tenantOf(c).DB)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p)
}

// apiSetRetention changes the policy; the change is audited with the
// policy before and after. The retention loop applies it on its next round.
func (s *Server) apiSetRetention(c echo.Context) error {
	return jsonCall(c, http.StatusOK, func(req retention.Policy) (retention.Policy, error) {
		if err := req.Validate(); err != nil {
			return req, err
		}
		ctx := c.Request().Context()
		err := s.mutate(c, func(m *orgTx) error {
			before, err := retention.Load(ctx, m.tx)
			if err != nil {
				return err
			}
			if err := retention.Save(ctx, m.tx, req); err != nil {
				return err
			}
			return m.audit("settings.retention", audit.Target{Type: "settings", ID: "retention", Name: "retention policy"},
				map[string]any{"before": before, "after": req})
		})
		return req, err
	})
}

func (s *Server) apiAuditArchives(c echo.Context) error {
	list, err := tenantOf(c).Audit.Archives(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"items": list})
}

// apiAuditArchive downloads one archive as JSONL (each removed event with
// its seq, prev_hash and hash), after auditing the download. It verifies
// on its own: console audit verify --file.
func (s *Server) apiAuditArchive(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	t := tenantOf(c)
	if _, err := t.Audit.ArchiveInfo(c.Request().Context(), id); errors.Is(err, audit.ErrNoArchive) {
		return apperr.New(apperr.ErrNotFound, "archive_not_found", "There is no audit archive %d.", id)
	} else if err != nil {
		return err
	}
	if err := s.audited(c, "audit.archive_download", audit.Target{Type: "audit_archive", ID: itoa(id)}, nil); err != nil {
		return err
	}
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, "application/x-ndjson")
	h.Set(echo.HeaderContentDisposition, fmt.Sprintf(`attachment; filename="audit-%s-archive-%d.jsonl"`, t.Org.Slug, id))
	c.Response().WriteHeader(http.StatusOK)
	if _, err := t.Audit.WriteArchive(c.Request().Context(), id, c.Response()); err != nil {
		// The answer has begun: the client sees a short file, the log why.
		s.Logger.Error("audit archive download failed", "org", t.Org.Slug, "archive", id, "error", err)
	}
	return nil
}
