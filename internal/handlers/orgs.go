package handlers

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/views"
)

// orgJSON is the API shape of an organization.
type orgJSON struct {
	Slug        string     `json:"slug"`
	Name        string     `json:"name"`
	Status      string     `json:"status"`
	Database    orgDBJSON  `json:"database"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	SuspendedAt *time.Time `json:"suspended_at"`
}

type orgDBJSON struct {
	Dialect  string `json:"dialect"`
	Attached bool   `json:"attached"`
}

func toOrgJSON(o orgs.Org) orgJSON {
	return orgJSON{Slug: o.Slug, Name: o.Name, Status: o.Status, Database: orgDBJSON{Dialect: string(o.Dialect), Attached: o.Attached},
		CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt, SuspendedAt: o.SuspendedAt}
}

func toOrgRow(o orgs.Org) views.OrgRow {
	db := "SQLite file"
	if o.Dialect == store.Postgres {
		db = "Postgres database"
		if o.Attached {
			db = "attached Postgres database"
		}
	}
	return views.OrgRow{Slug: o.Slug, Name: o.Name, Status: o.Status, Database: db, CreatedAt: o.CreatedAt, SuspendedAt: o.SuspendedAt}
}

func orgTarget(o orgs.Org) audit.Target {
	return audit.Target{Type: "organization", ID: o.Slug, Name: o.Name}
}

// pageParams reads limit (1..100, default 50) and the keyset cursor.
func pageParams(c echo.Context) (after string, limit int, err error) {
	limit = 50
	if v := c.QueryParam("limit"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 1 || n > 100 {
			return "", 0, apperr.New(apperr.ErrInvalid, "bad_limit", "limit must be a whole number from 1 to 100.")
		}
		limit = n
	}
	return c.QueryParam("after"), limit, nil
}

type listOrgsResponse struct {
	Items     []orgJSON `json:"items"`
	NextAfter string    `json:"next_after,omitempty"`
}

func (s *Server) apiListOrgs(c echo.Context) error {
	after, limit, err := pageParams(c)
	if err != nil {
		return err
	}
	list, err := s.Orgs.List(c.Request().Context(), after, limit+1)
	if err != nil {
		return err
	}
	resp := listOrgsResponse{Items: []orgJSON{}}
	for i, o := range list {
		if i == limit {
			resp.NextAfter = list[i-1].Slug
			break
		}
		resp.Items = append(resp.Items, toOrgJSON(o))
	}
	return c.JSON(http.StatusOK, resp)
}

type createOrgRequest struct {
	Slug        string `json:"slug"`
	Name        string `json:"name"`
	DatabaseURL string `json:"database_url"`
}

// createOrg creates and audits: the platform record commits with the
// activation, and the org's own log starts with who created it. The
// attached DSN may hold a password and is never echoed or audited.
func (s *Server) createOrg(c echo.Context, req createOrgRequest) (orgs.Org, error) {
	actor := principalOf(c).AuditActor()
	record := func(action string) func(orgs.Org) audit.Event {
		return func(o orgs.Org) audit.Event {
			return requestEvent(c, actor, action, orgTarget(o), audit.Allow,
				map[string]any{"after": map[string]any{"slug": o.Slug, "name": o.Name, "dialect": o.Dialect, "attached": o.Attached}})
		}
	}
	return s.Orgs.Create(c.Request().Context(), orgs.CreateInput{Slug: req.Slug, Name: req.Name, AttachDSN: req.DatabaseURL,
		Event: record("org.create"), OrgEvent: record("org.create")})
}

func (s *Server) apiCreateOrg(c echo.Context) error {
	return jsonCall(c, http.StatusCreated, func(req createOrgRequest) (orgJSON, error) {
		o, err := s.createOrg(c, req)
		return toOrgJSON(o), err
	})
}

func (s *Server) apiGetOrg(c echo.Context) error {
	o, err := s.Orgs.Get(c.Request().Context(), c.Param("org"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toOrgJSON(o))
}

type updateOrgRequest struct {
	Name *string `json:"name"`
}

func (s *Server) apiUpdateOrg(c echo.Context) error {
	var req updateOrgRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	before, after, err := s.Orgs.Update(c.Request().Context(), c.Param("org"), orgs.UpdateInput{Name: req.Name})
	if err != nil {
		return err
	}
	if err := s.platformEvent(c, principalOf(c).AuditActor(), "org.update", orgTarget(after), audit.Allow,
		map[string]any{"before": map[string]any{"name": before.Name}, "after": map[string]any{"name": after.Name}}); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toOrgJSON(after))
}

// setStatus suspends or resumes; the platform record commits with the
// change, so neither happens without the other.
func (s *Server) setStatus(c echo.Context, status, action string) (orgs.Org, error) {
	actor := principalOf(c).AuditActor()
	o, err := s.Orgs.SetStatusAudited(c.Request().Context(), c.Param("org"), status, func(o orgs.Org) audit.Event {
		return requestEvent(c, actor, action, orgTarget(o), audit.Allow, map[string]any{"after": map[string]any{"status": status}})
	})
	if err != nil {
		return o, err
	}
	s.forgetOrg(o.Slug)
	return o, nil
}

// forgetOrg drops what this process holds for an org that was suspended,
// resumed or deleted: its tenant runtime, its cached sessions and gateway
// settings. The caches are keyed by the org's database, which a re-created
// org does not share, so this is not what keeps them correct; it frees
// them at once rather than when they age out.
func (s *Server) forgetOrg(slug string) {
	s.Tenants.Forget(slug)
	s.SessionsRT.ForgetOrg(slug)
	if s.Gateway != nil {
		s.Gateway.ForgetOrg(slug)
	}
}

func (s *Server) apiSuspendOrg(c echo.Context) error {
	o, err := s.setStatus(c, orgs.StatusSuspended, "org.suspend")
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toOrgJSON(o))
}

func (s *Server) apiResumeOrg(c echo.Context) error {
	o, err := s.setStatus(c, orgs.StatusActive, "org.resume")
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toOrgJSON(o))
}

// deleteOrg deletes after confirmation; the record commits with the
// decision, before the database is dropped.
func (s *Server) deleteOrg(c echo.Context, confirm string) error {
	actor := principalOf(c).AuditActor()
	o, err := s.Orgs.DeleteAudited(c.Request().Context(), c.Param("org"), confirm, func(o orgs.Org) audit.Event {
		return requestEvent(c, actor, "org.delete", orgTarget(o), audit.Allow,
			map[string]any{"before": map[string]any{"slug": o.Slug, "name": o.Name, "status": o.Status}})
	})
	if err != nil {
		return err
	}
	s.forgetOrg(o.Slug)
	return nil
}

// apiDeleteOrg is two-step: the caller repeats the slug in ?confirm=.
func (s *Server) apiDeleteOrg(c echo.Context) error {
	if err := s.deleteOrg(c, c.QueryParam("confirm")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) pageOrgs(c echo.Context) error {
	list, err := s.Orgs.List(c.Request().Context(), "", 0)
	if err != nil {
		return err
	}
	rows := make([]views.OrgRow, len(list))
	for i, o := range list {
		rows[i] = toOrgRow(o)
	}
	var report views.OrphanReport
	orphans, err := s.Orgs.Orphans(c.Request().Context())
	if err != nil {
		// The organizations themselves are listed; say what is missing.
		s.Logger.Warn("list unclaimed org databases", "error", err)
		report.Error = "Could not check for unclaimed databases: the database server did not answer. The list above is complete."
	}
	for _, o := range orphans {
		label := "Postgres database"
		if o.Kind == orgs.OrphanSQLite {
			label = "SQLite file in the data directory"
		}
		report.Rows = append(report.Rows, views.OrphanRow{Kind: o.Kind, Name: o.Name, Label: label})
	}
	rows, ls := sortPage(c, rows, sortKeys[views.OrgRow]{
		"slug": byText(func(o views.OrgRow) string { return o.Slug }), "name": byText(func(o views.OrgRow) string { return o.Name }),
		"status":  byText(func(o views.OrgRow) string { return o.Status }),
		"created": func(a, b views.OrgRow) int { return a.CreatedAt.Compare(b.CreatedAt) },
	}, "slug", nil)
	return render(c, http.StatusOK, views.OrgList(s.page(c, "Organizations"), rows, report, ls))
}

// orphanJSON is the API shape of an unclaimed org database.
type orphanJSON struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	Slug string `json:"slug"`
}

// apiListOrphans lists databases named like an org's that no org uses.
func (s *Server) apiListOrphans(c echo.Context) error {
	list, err := s.Orgs.Orphans(c.Request().Context())
	if err != nil {
		return err
	}
	items := []orphanJSON{}
	for _, o := range list {
		items = append(items, orphanJSON{Kind: o.Kind, Name: o.Name, Slug: o.Slug})
	}
	return c.JSON(http.StatusOK, map[string]any{"items": items})
}

// removeOrphan drops an unclaimed database an admin chose, audited first.
func (s *Server) removeOrphan(c echo.Context, kind, name string) (orgs.Orphan, error) {
	actor := principalOf(c).AuditActor()
	return s.Orgs.DropOrphan(c.Request().Context(), kind, name, func(o orgs.Orphan) audit.Event {
		return requestEvent(c, actor, "org.orphan_remove", audit.Target{Type: "database", ID: o.Name, Name: o.Name}, audit.Allow,
			map[string]any{"before": map[string]any{"kind": o.Kind, "name": o.Name, "slug": o.Slug}})
	})
}

func (s *Server) apiRemoveOrphan(c echo.Context) error {
	if _, err := s.removeOrphan(c, c.Param("kind"), c.Param("name")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) pageRemoveOrphan(c echo.Context) error {
	o, err := s.removeOrphan(c, c.FormValue("kind"), c.FormValue("name"))
	if err != nil {
		return err
	}
	s.setFlash(c, "The unclaimed database "+o.Name+" was removed.")
	return c.Redirect(http.StatusSeeOther, "/admin/orgs")
}

func (s *Server) pageOrgNew(c echo.Context) error {
	return render(c, http.StatusOK, views.OrgNew(s.page(c, "New organization"), views.OrgForm{CanAttach: s.canAttach()}))
}

func (s *Server) canAttach() bool { return store.DialectOfDB(s.Catalog) == store.Postgres }

func (s *Server) pageOrgCreate(c echo.Context) error {
	req := createOrgRequest{Slug: c.FormValue("slug"), Name: c.FormValue("name"), DatabaseURL: c.FormValue("database_url")}
	if !s.canAttach() {
		req.DatabaseURL = ""
	}
	o, err := s.createOrg(c, req)
	var ve *apperr.ValidationError
	var ae *apperr.Error
	if errors.As(err, &ve) || (errors.As(err, &ae) && ae.Kind != nil && statusOf(ae.Kind) < 500) {
		fields := map[string]string{}
		if ve != nil {
			fields = ve.Fields
		} else {
			fields["slug"] = ae.Message
		}
		return render(c, http.StatusBadRequest, views.OrgNew(s.page(c, "New organization"),
			views.OrgForm{Slug: req.Slug, Name: req.Name, CanAttach: s.canAttach(), Errors: fields}))
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Organization "+o.Slug+" was created.")
	return c.Redirect(http.StatusSeeOther, "/admin/orgs/"+o.Slug)
}

func (s *Server) pageOrgDetail(c echo.Context) error {
	o, err := s.Orgs.Get(c.Request().Context(), c.Param("org"))
	if err != nil {
		return err
	}
	row := toOrgRow(o)
	row.SignInURL = s.orgSignInURL(c, o.Slug)
	return render(c, http.StatusOK, views.OrgDetail(s.page(c, o.Name), row))
}

func (s *Server) pageOrgSuspend(c echo.Context) error {
	o, err := s.setStatus(c, orgs.StatusSuspended, "org.suspend")
	if err != nil {
		return err
	}
	s.setFlash(c, "Organization "+o.Slug+" is suspended.")
	return c.Redirect(http.StatusSeeOther, "/admin/orgs/"+o.Slug)
}

func (s *Server) pageOrgResume(c echo.Context) error {
	o, err := s.setStatus(c, orgs.StatusActive, "org.resume")
	if err != nil {
		return err
	}
	s.setFlash(c, "Organization "+o.Slug+" is active again.")
	return c.Redirect(http.StatusSeeOther, "/admin/orgs/"+o.Slug)
}

func (s *Server) pageOrgDeleteConfirm(c echo.Context) error {
	o, err := s.Orgs.Get(c.Request().Context(), c.Param("org"))
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.OrgDelete(s.page(c, "Delete "+o.Name), toOrgRow(o), ""))
}

func (s *Server) pageOrgDelete(c echo.Context) error {
	err := s.deleteOrg(c, c.FormValue("confirm"))
	var ve *apperr.ValidationError
	if errors.As(err, &ve) {
		o, gerr := s.Orgs.Get(c.Request().Context(), c.Param("org"))
		if gerr != nil {
			return gerr
		}
		return render(c, http.StatusBadRequest, views.OrgDelete(s.page(c, "Delete "+o.Name), toOrgRow(o), ve.Fields["confirm"]))
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Organization "+c.Param("org")+" and its database were deleted.")
	return c.Redirect(http.StatusSeeOther, "/admin/orgs")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
