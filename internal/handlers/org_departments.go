package handlers

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/views"
)

type deptJSON struct {
	ID          int64     `json:"id"`
	Name        string    `json:"name"`
	Description string    `json:"description"`
	CreatedAt   time.Time `json:"created_at"`
}

func toDeptJSON(d directory.Department) deptJSON {
	return deptJSON{ID: d.ID, Name: d.Name, Description: d.Description, CreatedAt: d.CreatedAt.UTC()}
}

func deptTarget(d directory.Department) audit.Target {
	return audit.Target{Type: "department", ID: itoa(d.ID), Name: d.Name}
}

func parseID(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return 0, errors.New("bad id")
	}
	return n, nil
}

// visibleDepartments lists every department for principals allowed to read
// departments org-wide, else only those they hold a role in.
func (s *Server) visibleDepartments(c echo.Context) ([]directory.Department, error) {
	t, p := tenantOf(c), principalOf(c)
	ctx := c.Request().Context()
	all, err := t.Enforcer.Allowed(ctx, p.Subject, rbac.DomainOrg, "departments", "read")
	if err != nil {
		return nil, err
	}
	if all {
		return t.Dir.ListDepartments(ctx, nil)
	}
	ids := []int64{}
	doms, err := t.Enforcer.DomainsOf(p.Subject)
	if err != nil {
		return nil, err
	}
	for _, dom := range doms {
		if id, err := parseID(strings.TrimPrefix(dom, "dept:")); err == nil {
			ids = append(ids, id)
		}
	}
	return t.Dir.ListDepartments(ctx, ids)
}

func (s *Server) apiListDepartments(c echo.Context) error {
	ds, err := s.visibleDepartments(c)
	if err != nil {
		return err
	}
	out := make([]deptJSON, len(ds))
	for i, d := range ds {
		out[i] = toDeptJSON(d)
	}
	return c.JSON(http.StatusOK, map[string]any{"items": out})
}

type deptRequest struct {
	Name        *string `json:"name"`
	Description *string `json:"description"`
}

func (s *Server) createDepartment(c echo.Context, name, desc string) (directory.Department, error) {
	var d directory.Department
	err := s.mutate(c, func(m *orgTx) error {
		var err error
		if d, err = m.Dir.CreateDepartment(c.Request().Context(), name, desc); err != nil {
			return err
		}
		return m.audit("department.create", deptTarget(d), map[string]any{"after": toDeptJSON(d)})
	})
	return d, err
}

func (s *Server) apiCreateDepartment(c echo.Context) error {
	return jsonCall(c, http.StatusCreated, func(req deptRequest) (deptJSON, error) {
		d, err := s.createDepartment(c, deref(req.Name), deref(req.Description))
		return toDeptJSON(d), err
	})
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func (s *Server) apiGetDepartment(c echo.Context) error {
	id, err := idParam(c, "dept")
	if err != nil {
		return err
	}
	d, err := tenantOf(c).Dir.GetDepartment(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toDeptJSON(d))
}

func (s *Server) apiUpdateDepartment(c echo.Context) error {
	id, err := idParam(c, "dept")
	if err != nil {
		return err
	}
	var req deptRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	var after directory.Department
	err = s.mutate(c, func(m *orgTx) error {
		before, a, err := m.Dir.UpdateDepartment(c.Request().Context(), id, req.Name, req.Description)
		if err != nil {
			return err
		}
		after = a
		return m.audit("department.update", deptTarget(after), map[string]any{"before": toDeptJSON(before), "after": toDeptJSON(after)})
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toDeptJSON(after))
}

func (s *Server) deleteDepartment(c echo.Context, id int64) error {
	t := tenantOf(c)
	err := s.mutate(c, func(m *orgTx) error {
		d, err := m.Dir.DeleteDepartment(c.Request().Context(), id)
		if err != nil {
			return err
		}
		return m.audit("department.delete", deptTarget(d), map[string]any{"before": toDeptJSON(d)})
	})
	if err != nil {
		return err
	}
	// Role assignments in a domain that no longer exists grant nothing, so
	// clearing them after the commit cannot leave anyone with access.
	return t.Enforcer.RemoveDomain(c.Request().Context(), rbac.DeptDomain(id))
}

func (s *Server) apiDeleteDepartment(c echo.Context) error {
	id, err := idParam(c, "dept")
	if err != nil {
		return err
	}
	if err := s.deleteDepartment(c, id); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

type memberJSON struct {
	UserID int64  `json:"user_id"`
	Email  string `json:"email"`
	Name   string `json:"name"`
	Role   string `json:"role"`
}

// members lists a department's owners and members, after checking the
// department exists (so a missing one is 404, not an empty list).
func (s *Server) members(c echo.Context, deptID int64) (directory.Department, []memberJSON, error) {
	t := tenantOf(c)
	ctx := c.Request().Context()
	d, err := t.Dir.GetDepartment(ctx, deptID)
	if err != nil {
		return d, nil, err
	}
	as, err := t.Enforcer.Assignments("", rbac.DeptDomain(deptID))
	if err != nil {
		return d, nil, err
	}
	var ids []int64
	for _, a := range as {
		if id, err := parseID(strings.TrimPrefix(a.Subject, "user:")); err == nil {
			ids = append(ids, id)
		}
	}
	users, err := t.Dir.UsersByID(ctx, ids)
	if err != nil {
		return d, nil, err
	}
	out := []memberJSON{}
	for _, a := range as {
		id, err := parseID(strings.TrimPrefix(a.Subject, "user:"))
		if err != nil {
			continue
		}
		u := users[id]
		out = append(out, memberJSON{UserID: id, Email: u.Email, Name: u.Name, Role: a.Role})
	}
	return d, out, nil
}

func (s *Server) apiListMembers(c echo.Context) error {
	id, err := idParam(c, "dept")
	if err != nil {
		return err
	}
	_, ms, err := s.members(c, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"items": ms})
}

type memberRequest struct {
	Role string `json:"role"`
}

// deptRole maps the member API's role names to casbin roles.
func deptRole(r string) (string, error) {
	switch r {
	case "owner", rbac.RoleDeptOwner:
		return rbac.RoleDeptOwner, nil
	case rbac.RoleMember:
		return rbac.RoleMember, nil
	}
	return "", &apperr.ValidationError{Fields: map[string]string{"role": "Role must be \"owner\" or \"member\"."}}
}

// setMember makes a user an owner or member of a department, replacing
// any other role they had there.
func (s *Server) setMember(c echo.Context, deptID, userID int64, role string) error {
	t := tenantOf(c)
	ctx := c.Request().Context()
	r, err := deptRole(role)
	if err != nil {
		return err
	}
	d, err := t.Dir.GetDepartment(ctx, deptID)
	if err != nil {
		return err
	}
	u, err := t.Dir.GetUser(ctx, userID)
	if err != nil {
		return err
	}
	dom, sub := rbac.DeptDomain(deptID), directory.UserSubject(userID)
	return s.auditedRoles(c, sub, dom, func() error {
		return t.Enforcer.SetRoles(ctx, sub, dom, []string{r})
	}, "department.member_set", deptTarget(d), map[string]any{"after": map[string]any{"user": u.Email, "role": r}})
}

func (s *Server) removeMember(c echo.Context, deptID, userID int64) error {
	t := tenantOf(c)
	ctx := c.Request().Context()
	d, err := t.Dir.GetDepartment(ctx, deptID)
	if err != nil {
		return err
	}
	dom, sub := rbac.DeptDomain(deptID), directory.UserSubject(userID)
	held, err := t.Enforcer.RolesIn(sub, dom)
	if err != nil {
		return err
	}
	if len(held) == 0 {
		return apperr.New(apperr.ErrNotFound, "member_not_found", "That user is not in this department.")
	}
	return s.auditedRoles(c, sub, dom, func() error {
		return t.Enforcer.SetRoles(ctx, sub, dom, nil)
	}, "department.member_remove", deptTarget(d), map[string]any{"before": map[string]any{"user_id": userID}})
}

func (s *Server) apiPutMember(c echo.Context) error {
	deptID, err := idParam(c, "dept")
	if err != nil {
		return err
	}
	uid, err := idParam(c, "uid")
	if err != nil {
		return err
	}
	var req memberRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if err := s.setMember(c, deptID, uid, req.Role); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) apiDeleteMember(c echo.Context) error {
	deptID, err := idParam(c, "dept")
	if err != nil {
		return err
	}
	uid, err := idParam(c, "uid")
	if err != nil {
		return err
	}
	if err := s.removeMember(c, deptID, uid); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// Roles and explicit rules (org admins).

type rolesResponse struct {
	Roles       []rbac.RoleInfo   `json:"roles"`
	Assignments []rbac.Assignment `json:"assignments"`
}

func (s *Server) apiListRoles(c echo.Context) error {
	as, err := tenantOf(c).Enforcer.Assignments(c.QueryParam("subject"), c.QueryParam("domain"))
	if err != nil {
		return err
	}
	if as == nil {
		as = []rbac.Assignment{}
	}
	return c.JSON(http.StatusOK, rolesResponse{Roles: rbac.Roles(), Assignments: as})
}

// assign validates and records a role assignment to an existing subject.
func (s *Server) assign(c echo.Context, a rbac.Assignment) error {
	t := tenantOf(c)
	ctx := c.Request().Context()
	if msg := rbac.ValidAssignment(a); msg != "" {
		return &apperr.ValidationError{Fields: map[string]string{"role": msg}}
	}
	if err := s.checkSubject(c, a.Subject); err != nil {
		return err
	}
	if id, ok := strings.CutPrefix(a.Domain, "dept:"); ok {
		n, err := parseID(id)
		if err != nil {
			return &apperr.ValidationError{Fields: map[string]string{"domain": "Domain must be \"org\" or \"dept:<id>\"."}}
		}
		if _, err := t.Dir.GetDepartment(ctx, n); err != nil {
			return err
		}
	}
	held, err := t.Enforcer.RolesIn(a.Subject, a.Domain)
	if err != nil {
		return err
	}
	for _, r := range held {
		if r == a.Role {
			return nil // already held: nothing to change or record
		}
	}
	return s.auditedRoles(c, a.Subject, a.Domain, func() error {
		_, err := t.Enforcer.Assign(ctx, a)
		return err
	}, "role.assign", audit.Target{Type: "subject", ID: a.Subject}, map[string]any{"after": a})
}

func (s *Server) unassign(c echo.Context, a rbac.Assignment) error {
	t := tenantOf(c)
	return s.auditedRoles(c, a.Subject, a.Domain, func() error {
		changed, err := t.Enforcer.Unassign(c.Request().Context(), a)
		if errors.Is(err, rbac.ErrBuiltin) {
			return builtinErr()
		}
		if err == nil && !changed {
			return apperr.New(apperr.ErrNotFound, "assignment_not_found", "That subject does not hold that role there.")
		}
		return err
	}, "role.unassign", audit.Target{Type: "subject", ID: a.Subject}, map[string]any{"before": a})
}

// auditedRoles applies a change to sub's roles in dom and audits it. Casbin
// writes use the adapter's own connection, so they cannot share the audit
// record's transaction; instead, when the record cannot be written the
// roles are put back as they were, so nothing is half-written.
func (s *Server) auditedRoles(c echo.Context, sub, dom string, change func() error, action string, target audit.Target, details any) error {
	return s.auditedRolesBy(c, sub, dom, change, func() error { return s.audited(c, action, target, details) })
}

// auditedRolesBy is auditedRoles with the record written by record (which
// may name another actor, or write more than the audit record): when
// record fails, sub's roles in dom are put back as they were.
func (s *Server) auditedRolesBy(c echo.Context, sub, dom string, change, record func() error) error {
	t := tenantOf(c)
	prev, err := t.Enforcer.RolesIn(sub, dom)
	if err != nil {
		return err
	}
	if err := change(); err != nil {
		return err
	}
	if err := record(); err != nil {
		if rerr := t.Enforcer.SetRoles(context.WithoutCancel(c.Request().Context()), sub, dom, prev); rerr != nil {
			s.Logger.Error("restore roles after failed audit", "org", t.Org.Slug, "subject", sub, "domain", dom, "error", rerr)
		}
		return err
	}
	return nil
}

// checkSubject makes sure a user or key subject exists in this org.
func (s *Server) checkSubject(c echo.Context, sub string) error {
	t := tenantOf(c)
	ctx := c.Request().Context()
	bad := &apperr.ValidationError{Fields: map[string]string{"subject": "Subject must be \"user:<id>\" or \"key:<id>\" of this organization."}}
	switch {
	case strings.HasPrefix(sub, "user:"):
		id, err := parseID(strings.TrimPrefix(sub, "user:"))
		if err != nil {
			return bad
		}
		_, err = t.Dir.GetUser(ctx, id)
		return err
	case strings.HasPrefix(sub, "key:"):
		id, err := parseID(strings.TrimPrefix(sub, "key:"))
		if err != nil {
			return bad
		}
		k, err := t.Dir.GetKey(ctx, id)
		if err == nil && !k.IsService() {
			return &apperr.ValidationError{Fields: map[string]string{"subject": "Personal keys act with their owner's roles; assign roles to the user instead."}}
		}
		return err
	}
	return bad
}

func builtinErr() error {
	return apperr.New(apperr.ErrConflict, "builtin_rule",
		"That is a built-in rule (a role's definition, or platform admins' access) and cannot be removed; add a deny rule instead.")
}

func (s *Server) apiAssignRole(c echo.Context) error {
	var a rbac.Assignment
	if err := decodeJSON(c, &a); err != nil {
		return err
	}
	if err := s.assign(c, a); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// apiUnassignRole takes the assignment as the API reference documents it,
// a JSON body like the assign's; the query parameters it was once read
// from still work.
func (s *Server) apiUnassignRole(c echo.Context) error {
	a := rbac.Assignment{Subject: c.QueryParam("subject"), Role: c.QueryParam("role"), Domain: c.QueryParam("domain")}
	if a == (rbac.Assignment{}) {
		if err := decodeJSON(c, &a); err != nil {
			return err
		}
	}
	if err := s.unassign(c, a); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) apiListRules(c echo.Context) error {
	rs, err := tenantOf(c).Enforcer.Rules()
	if err != nil {
		return err
	}
	if rs == nil {
		rs = []rbac.Rule{}
	}
	return c.JSON(http.StatusOK, map[string]any{"items": rs})
}

func validRule(r rbac.Rule) error {
	v := apperr.Validation()
	if r.Effect != "allow" && r.Effect != "deny" {
		v.Add("effect", "Effect must be \"allow\" or \"deny\".")
	}
	if r.Subject == "" || r.Object == "" || r.Action == "" {
		v.Add("subject", "Subject, object and action are required.")
	}
	if r.Domain != rbac.DomainOrg && !strings.HasPrefix(r.Domain, "dept:") {
		v.Add("domain", "Domain must be \"org\" or \"dept:<id>\" (or \"dept:*\").")
	}
	if rbac.BuiltinSubject(r.Subject) {
		v.Add("subject", "%q is built in (platform admins or a role); rules may target users and service keys only.", r.Subject)
	}
	// The rule table's unique index has a per-entry size limit on Postgres.
	for field, val := range map[string]string{"subject": r.Subject, "domain": r.Domain, "object": r.Object, "action": r.Action} {
		if len(val) > maxRuleField {
			v.Add(field, "At most %d characters.", maxRuleField)
		}
	}
	return v.Err()
}

// maxRuleField bounds each field of a policy rule.
const maxRuleField = 200

func (s *Server) apiAddRule(c echo.Context) error {
	var r rbac.Rule
	if err := decodeJSON(c, &r); err != nil {
		return err
	}
	if err := validRule(r); err != nil {
		return err
	}
	en := tenantOf(c).Enforcer
	added, err := en.AddRule(c.Request().Context(), r)
	if errors.Is(err, rbac.ErrBuiltin) {
		return builtinErr()
	}
	if err != nil {
		return err
	}
	if !added {
		return c.NoContent(http.StatusNoContent)
	}
	if err := s.audited(c, "policy.add", audit.Target{Type: "policy", ID: r.Subject}, map[string]any{"after": r}); err != nil {
		// Nothing half-written: the unrecorded rule is taken back.
		if _, rerr := en.RemoveRule(context.WithoutCancel(c.Request().Context()), r); rerr != nil {
			s.Logger.Error("undo unrecorded policy add", "org", tenantOf(c).Org.Slug, "error", rerr)
		}
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// apiRemoveRule takes the rule from the query or, when the query names
// none of its fields, from a JSON body, as apiUnassignRole does.
func (s *Server) apiRemoveRule(c echo.Context) error {
	r := rbac.Rule{Subject: c.QueryParam("subject"), Domain: c.QueryParam("domain"), Object: c.QueryParam("object"), Action: c.QueryParam("action"), Effect: c.QueryParam("effect")}
	if r == (rbac.Rule{}) {
		if err := decodeJSON(c, &r); err != nil {
			return err
		}
	}
	ok, err := tenantOf(c).Enforcer.RemoveRule(c.Request().Context(), r)
	if errors.Is(err, rbac.ErrBuiltin) {
		return builtinErr()
	}
	if err != nil {
		return err
	}
	if !ok {
		return apperr.New(apperr.ErrNotFound, "rule_not_found", "No such rule exists.")
	}
	if err := s.audited(c, "policy.remove", audit.Target{Type: "policy", ID: r.Subject}, map[string]any{"before": r}); err != nil {
		// Nothing half-written: the unrecorded removal is taken back.
		if _, rerr := tenantOf(c).Enforcer.AddRule(context.WithoutCancel(c.Request().Context()), r); rerr != nil {
			s.Logger.Error("undo unrecorded policy removal", "org", tenantOf(c).Org.Slug, "error", rerr)
		}
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// Pages.

func (s *Server) pageDepartments(c echo.Context) error {
	return s.renderDepartments(c, http.StatusOK, "", "", nil)
}

func (s *Server) renderDepartments(c echo.Context, status int, name, desc string, errs map[string]string) error {
	ds, err := s.visibleDepartments(c)
	if err != nil {
		return err
	}
	rows := make([]views.DeptRow, len(ds))
	for i, d := range ds {
		rows[i] = views.DeptRow{ID: d.ID, Name: d.Name, Description: d.Description, CreatedAt: d.CreatedAt}
	}
	canCreate, err := actorOf(c).Allowed(c.Request().Context(), rbac.DomainOrg, "departments", "create")
	if err != nil {
		return err
	}
	rows, ls := sortPage(c, rows, sortKeys[views.DeptRow]{
		"name":    byText(func(d views.DeptRow) string { return d.Name }),
		"created": func(a, b views.DeptRow) int { return a.CreatedAt.Compare(b.CreatedAt) },
	}, "name", nil)
	return render(c, status, views.Departments(s.orgPage(c, "Departments"), views.DepartmentsData{
		Slug: tenantOf(c).Org.Slug, Rows: rows, CanCreate: canCreate, Name: name, Description: desc, Errors: errs, List: ls}))
}

func (s *Server) pageCreateDepartment(c echo.Context) error {
	name, desc := c.FormValue("name"), c.FormValue("description")
	d, err := s.createDepartment(c, name, desc)
	var ve *apperr.ValidationError
	if errors.As(err, &ve) {
		return s.renderDepartments(c, http.StatusBadRequest, name, desc, ve.Fields)
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Department "+d.Name+" was created.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/departments/"+itoa(d.ID))
}

func (s *Server) renderDepartment(c echo.Context, status int, memberErr string) error {
	id, err := idParam(c, "dept")
	if err != nil {
		return err
	}
	d, ms, err := s.members(c, id)
	if err != nil {
		return err
	}
	rows := make([]views.MemberRow, len(ms))
	for i, m := range ms {
		rows[i] = views.MemberRow{UserID: m.UserID, Email: m.Email, Name: m.Name, Role: m.Role}
	}
	a := actorOf(c)
	canManage, err := a.Allowed(c.Request().Context(), rbac.DeptDomain(id), "members", "update")
	if err != nil {
		return err
	}
	canDelete, err := a.Allowed(c.Request().Context(), rbac.DeptDomain(id), "departments/"+itoa(id), "delete")
	if err != nil {
		return err
	}
	return render(c, status, views.DepartmentDetail(s.orgPage(c, d.Name), views.DepartmentData{
		Slug: tenantOf(c).Org.Slug, ID: d.ID, Name: d.Name, Description: d.Description, Members: rows,
		CanManage: canManage, CanDelete: canDelete, MemberError: memberErr}))
}

func (s *Server) pageDepartment(c echo.Context) error {
	return s.renderDepartment(c, http.StatusOK, "")
}

func (s *Server) pageAddMember(c echo.Context) error {
	id, err := idParam(c, "dept")
	if err != nil {
		return err
	}
	u, err := tenantOf(c).Dir.UserByEmail(c.Request().Context(), c.FormValue("email"))
	if err == nil {
		err = s.setMember(c, id, u.ID, c.FormValue("role"))
	}
	if err != nil {
		status, body := classify(err)
		if status >= 500 {
			return err
		}
		return s.renderDepartment(c, http.StatusBadRequest, body.Message)
	}
	s.setFlash(c, u.Email+" was added.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/departments/"+itoa(id))
}

func (s *Server) pageRemoveMember(c echo.Context) error {
	id, err := idParam(c, "dept")
	if err != nil {
		return err
	}
	uid, err := idParam(c, "uid")
	if err != nil {
		return err
	}
	if err := s.removeMember(c, id, uid); err != nil {
		return err
	}
	s.setFlash(c, "The member was removed.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/departments/"+itoa(id))
}

func (s *Server) pageDeleteDepartment(c echo.Context) error {
	id, err := idParam(c, "dept")
	if err != nil {
		return err
	}
	d, err := tenantOf(c).Dir.GetDepartment(c.Request().Context(), id)
	if err != nil {
		return err
	}
	if c.FormValue("confirm") != d.Name {
		return s.renderDepartment(c, http.StatusBadRequest, "Type the department's name exactly to delete it.")
	}
	if err := s.deleteDepartment(c, id); err != nil {
		return err
	}
	s.setFlash(c, "Department "+d.Name+" was deleted.")
	return c.Redirect(http.StatusSeeOther, "/o/"+tenantOf(c).Org.Slug+"/departments")
}
