package handlers

import (
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

type userJSON struct {
	ID                 int64      `json:"id"`
	Email              string     `json:"email"`
	Name               string     `json:"name"`
	Status             string     `json:"status"`
	MustChangePassword bool       `json:"must_change_password"`
	CreatedAt          time.Time  `json:"created_at"`
	LastLoginAt        *time.Time `json:"last_login_at"`
}

func toUserJSON(u directory.User) userJSON {
	return userJSON{ID: u.ID, Email: u.Email, Name: u.Name, Status: u.Status, MustChangePassword: u.MustChangePassword, CreatedAt: u.CreatedAt.UTC(), LastLoginAt: u.LastLoginAt}
}

func userTarget(u directory.User) audit.Target {
	return audit.Target{Type: "user", ID: itoa(u.ID), Name: u.Email}
}

type listUsersResponse struct {
	Items     []userJSON `json:"items"`
	NextAfter int64      `json:"next_after,omitempty"`
}

func (s *Server) apiListUsers(c echo.Context) error {
	after, limit, err := idPage(c)
	if err != nil {
		return err
	}
	us, err := tenantOf(c).Dir.ListUsers(c.Request().Context(), after, limit+1)
	if err != nil {
		return err
	}
	resp := listUsersResponse{Items: []userJSON{}}
	for i, u := range us {
		if i == limit {
			resp.NextAfter = us[i-1].ID
			break
		}
		resp.Items = append(resp.Items, toUserJSON(u))
	}
	return c.JSON(http.StatusOK, resp)
}

// idPage reads limit and an integer keyset cursor "after".
func idPage(c echo.Context) (int64, int, error) {
	_, limit, err := pageParams(c)
	if err != nil {
		return 0, 0, err
	}
	var after int64
	if v := c.QueryParam("after"); v != "" {
		n, perr := parseID(v)
		if perr != nil {
			return 0, 0, apperr.New(apperr.ErrInvalid, "bad_cursor", "after must be a positive id.")
		}
		after = n
	}
	return after, limit, nil
}

type createUserRequest struct {
	Email string `json:"email"`
	Name  string `json:"name"`
}

type createUserResponse struct {
	User            userJSON `json:"user"`
	OneTimePassword string   `json:"one_time_password"`
}

func (s *Server) createUser(c echo.Context, req createUserRequest) (directory.User, string, error) {
	var u directory.User
	var otp string
	err := s.mutate(c, func(m *orgTx) error {
		var err error
		if u, otp, err = m.Dir.CreateUser(c.Request().Context(), req.Email, req.Name); err != nil {
			return err
		}
		return m.audit("user.create", userTarget(u), map[string]any{"after": map[string]any{"email": u.Email, "name": u.Name, "status": u.Status, "password": "[redacted]"}})
	})
	return u, otp, err
}

func (s *Server) apiCreateUser(c echo.Context) error {
	var req createUserRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	u, otp, err := s.createUser(c, req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, createUserResponse{User: toUserJSON(u), OneTimePassword: otp})
}

func (s *Server) apiGetUser(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	u, err := tenantOf(c).Dir.GetUser(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toUserJSON(u))
}

type updateUserRequest struct {
	Name   *string `json:"name"`
	Status *string `json:"status"`
}

func (s *Server) updateUser(c echo.Context, id int64, req updateUserRequest) (directory.User, error) {
	if req.Status != nil && *req.Status == directory.StatusDisabled && principalOf(c).UserID == id {
		return directory.User{}, &apperr.ValidationError{Fields: map[string]string{"status": "You cannot disable your own account."}}
	}
	var after directory.User
	err := s.mutate(c, func(m *orgTx) error {
		var before directory.User
		var err error
		if before, after, err = m.Dir.UpdateUser(c.Request().Context(), id, req.Name, req.Status); err != nil {
			return err
		}
		action := "user.update"
		if before.Status != after.Status {
			action = "user." + map[string]string{directory.StatusDisabled: "disable", directory.StatusActive: "enable"}[after.Status]
		}
		return m.audit(action, userTarget(after), map[string]any{
			"before": map[string]any{"name": before.Name, "status": before.Status},
			"after":  map[string]any{"name": after.Name, "status": after.Status}})
	})
	return after, err
}

func (s *Server) apiUpdateUser(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	var req updateUserRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	u, err := s.updateUser(c, id, req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toUserJSON(u))
}

func (s *Server) resetPassword(c echo.Context, id int64) (string, error) {
	var otp string
	err := s.mutate(c, func(m *orgTx) error {
		var err error
		if otp, err = m.Dir.ResetPassword(c.Request().Context(), id); err != nil {
			return err
		}
		u, err := m.Dir.GetUser(c.Request().Context(), id)
		if err != nil {
			return err
		}
		return m.audit("user.password_reset", userTarget(u), map[string]any{"after": map[string]any{"password": "[redacted]", "personal_keys": "revoked"}})
	})
	return otp, err
}

func (s *Server) apiResetPassword(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	otp, err := s.resetPassword(c, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]string{"one_time_password": otp})
}

// Pages.

// usersPageSize keeps the users page fast for large orgs.
const usersPageSize = 50

// userRows is one page of users after ?after=, and the id to continue
// from (0 at the end).
func (s *Server) userRows(c echo.Context) ([]views.UserRow, int64, error) {
	after, _ := strconv.ParseInt(c.QueryParam("after"), 10, 64)
	us, err := tenantOf(c).Dir.ListUsers(c.Request().Context(), max(after, 0), usersPageSize+1)
	if err != nil {
		return nil, 0, err
	}
	var next int64
	if len(us) > usersPageSize {
		us = us[:usersPageSize]
		next = us[len(us)-1].ID
	}
	t := tenantOf(c)
	rows := make([]views.UserRow, len(us))
	for i, u := range us {
		var roles []string
		as, err := t.Enforcer.Assignments(directory.UserSubject(u.ID), "")
		if err != nil {
			return nil, 0, err
		}
		for _, a := range as {
			roles = append(roles, views.RoleLabel(a.Role, s.domainLabel(c.Request().Context(), t, a.Domain)))
		}
		rows[i] = views.UserRow{ID: u.ID, Email: u.Email, Name: u.Name, Status: u.Status, LastLogin: u.LastLoginAt, CreatedAt: u.CreatedAt,
			Roles: strings.Join(roles, "; ")}
	}
	return rows, next, nil
}

// departmentOptions is the org's departments as role-form choices.
func departmentOptions(c echo.Context) ([]views.Option, error) {
	depts, err := tenantOf(c).Dir.ListDepartments(c.Request().Context(), nil)
	if err != nil {
		return nil, err
	}
	var opts []views.Option
	for _, d := range depts {
		opts = append(opts, views.Option{Value: rbac.DeptDomain(d.ID), Label: d.Name})
	}
	return opts, nil
}

// roleNone is the add-user form's explicit "no role yet".
const roleNone = "none"

// chosenRole turns a role form's role and domain into the assignment for
// user id, or field errors saying what to choose. Nothing is assumed: an
// empty role or, for a department role, an empty department is refused.
// ok is false for roleNone when allowNone is set (no assignment wanted).
func chosenRole(c echo.Context, id int64, role, domain string, allowNone bool) (a rbac.Assignment, ok bool, fields map[string]string) {
	switch {
	case role == roleNone && allowNone:
		return rbac.Assignment{}, false, nil
	case role == "":
		msg := "Choose a role to give."
		if allowNone {
			msg = "Choose a role for the new user, or \"No role yet\"."
		}
		return a, false, map[string]string{"role": msg}
	case role == rbac.RoleOrgAdmin || role == rbac.RoleAuditor:
		domain = rbac.DomainOrg
	case (role == rbac.RoleMember || role == rbac.RoleDeptOwner) && domain == "":
		return a, false, map[string]string{"domain": "Choose the department this role is in."}
	}
	a = rbac.Assignment{Subject: directory.UserSubject(id), Role: role, Domain: domain}
	if msg := rbac.ValidAssignment(a); msg != "" {
		return a, false, map[string]string{"role": msg}
	}
	if n, found := strings.CutPrefix(domain, "dept:"); found {
		did, err := parseID(n)
		if err == nil {
			_, err = tenantOf(c).Dir.GetDepartment(c.Request().Context(), did)
		}
		if err != nil {
			return a, false, map[string]string{"domain": "That department does not exist (any more); choose another."}
		}
	}
	return a, true, nil
}

func (s *Server) usersData(c echo.Context) (views.UsersData, error) {
	rows, next, err := s.userRows(c)
	if err != nil {
		return views.UsersData{}, err
	}
	depts, err := departmentOptions(c)
	if err != nil {
		return views.UsersData{}, err
	}
	base := "/o/" + tenantOf(c).Org.Slug + "/users"
	d := views.UsersData{Slug: tenantOf(c).Org.Slug, Rows: rows, Departments: depts}
	if next > 0 {
		d.NextURL = base + "?after=" + itoa(next)
	}
	if c.QueryParam("after") != "" {
		d.FirstURL = base
	}
	return d, nil
}

func (s *Server) pageUsers(c echo.Context) error {
	d, err := s.usersData(c)
	if err != nil {
		return err
	}
	// ?email= fills in the add form (the E2B page's "add yourself").
	d.Email = c.QueryParam("email")
	return render(c, http.StatusOK, views.Users(s.orgPage(c, "Users"), d))
}

// pageCreateUser adds a user and, in the same request, gives the role
// chosen on the form (or none, when "No role yet" was chosen). The role is
// checked before the user is created, so a refused choice creates nothing;
// the two changes are audited as user.create and role.assign, as when
// made one after the other.
func (s *Server) pageCreateUser(c echo.Context) error {
	req := createUserRequest{Email: c.FormValue("email"), Name: c.FormValue("name")}
	role, domain := c.FormValue("role"), c.FormValue("domain")
	refuse := func(fields map[string]string) error {
		d, err := s.usersData(c)
		if err != nil {
			return err
		}
		d.Email, d.Name, d.Role, d.Domain, d.Errors = req.Email, req.Name, role, domain, fields
		return render(c, http.StatusBadRequest, views.Users(s.orgPage(c, "Users"), d))
	}
	a, give, fields := chosenRole(c, 0, role, domain, true)
	if fields != nil {
		return refuse(fields)
	}
	if give {
		ok, err := actorOf(c).Allowed(c.Request().Context(), rbac.DomainOrg, "roles", "update")
		if err != nil {
			return err
		}
		if !ok {
			return refuse(map[string]string{"role": "You may add users but not give roles; choose \"No role yet\"."})
		}
	}
	u, otp, err := s.createUser(c, req)
	var ve *apperr.ValidationError
	if errors.As(err, &ve) {
		return refuse(ve.Fields)
	}
	if err != nil {
		return err
	}
	if give {
		a.Subject = directory.UserSubject(u.ID)
		if err := s.assign(c, a); err != nil {
			// The user exists: keep the password reachable and say what
			// is left to do rather than losing it behind an error page.
			s.Logger.Warn("role not given with a new user", "org", tenantOf(c).Org.Slug, "user_id", u.ID, "error", err)
			s.setFlash(c, "The user was added, but the role was not given. Give it below.")
		}
	}
	return s.redirectRevealing(c, userPath(c, u.ID), otp)
}

// userPathParam is the page of the user in the path.
func userPathParam(c echo.Context) (string, error) {
	id, err := idParam(c, "id")
	if err != nil {
		return "", err
	}
	return userPath(c, id), nil
}

func userPath(c echo.Context, id int64) string {
	return "/o/" + tenantOf(c).Org.Slug + "/users/" + itoa(id)
}

// redirectRevealing answers a POST that made a secret: the secret goes to
// the page at path, which shows it once after the redirect.
func (s *Server) redirectRevealing(c echo.Context, path, secret string) error {
	if err := s.stashReveal(c, path, secret); err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, path)
}

// renderUser writes the user's page; a refused role form keeps its choice
// in form and its field errors.
func (s *Server) renderUser(c echo.Context, id int64, otp string, form roleForm) error {
	t := tenantOf(c)
	ctx := c.Request().Context()
	u, err := t.Dir.GetUser(ctx, id)
	if err != nil {
		return err
	}
	var roles []views.RoleRow
	as, err := t.Enforcer.Assignments(directory.UserSubject(u.ID), "")
	if err != nil {
		return err
	}
	for _, a := range as {
		roles = append(roles, views.RoleRow{Role: a.Role, Domain: s.domainLabel(ctx, t, a.Domain), DomainKey: a.Domain})
	}
	opts, err := departmentOptions(c)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if form.Errors != nil {
		status = http.StatusBadRequest
	}
	return render(c, status, views.UserDetail(s.orgPage(c, u.Email), views.UserDetailData{
		Slug: t.Org.Slug, User: views.UserRow{ID: u.ID, Email: u.Email, Name: u.Name, Status: u.Status, LastLogin: u.LastLoginAt, CreatedAt: u.CreatedAt},
		OneTimePassword: otp, DismissURL: userPath(c, u.ID) + "/dismiss-secret", SignInURL: s.orgSignInURL(c, tenantOf(c).Org.Slug), Roles: roles, Departments: opts, Self: principalOf(c).UserID == u.ID,
		Role: form.Role, Domain: form.Domain, Errors: form.Errors}))
}

// roleForm is the user page's role form as submitted.
type roleForm struct {
	Role, Domain string
	Errors       map[string]string
}

func (s *Server) pageUser(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	return s.renderUser(c, id, s.keptReveal(c, userPath(c, id)), roleForm{})
}

func (s *Server) pageUserStatus(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	st := c.FormValue("status")
	if _, err := s.updateUser(c, id, updateUserRequest{Status: &st}); err != nil {
		return err
	}
	s.setFlash(c, "The account is now "+st+".")
	return c.Redirect(http.StatusSeeOther, c.Request().URL.Path[:len(c.Request().URL.Path)-len("/status")])
}

func (s *Server) pageUserName(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	name := c.FormValue("name")
	if _, err := s.updateUser(c, id, updateUserRequest{Name: &name}); err != nil {
		return err
	}
	s.setFlash(c, "The name was saved.")
	return c.Redirect(http.StatusSeeOther, userPath(c, id))
}

func (s *Server) pageUserReset(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	otp, err := s.resetPassword(c, id)
	if err != nil {
		return err
	}
	return s.redirectRevealing(c, userPath(c, id), otp)
}

// pageUserRole assigns or removes a role from the user page.
func (s *Server) pageUserRole(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	if _, err := tenantOf(c).Dir.GetUser(c.Request().Context(), id); err != nil {
		return err
	}
	if c.FormValue("op") == "remove" {
		a := rbac.Assignment{Subject: directory.UserSubject(id), Role: c.FormValue("role"), Domain: c.FormValue("domain")}
		if a.Role == rbac.RoleOrgAdmin || a.Role == rbac.RoleAuditor {
			a.Domain = rbac.DomainOrg
		}
		err = s.unassign(c, a)
	} else {
		f := roleForm{Role: c.FormValue("role"), Domain: c.FormValue("domain")}
		a, _, fields := chosenRole(c, id, f.Role, f.Domain, false)
		if fields != nil {
			f.Errors = fields
			return s.renderUser(c, id, s.keptReveal(c, userPath(c, id)), f)
		}
		err = s.assign(c, a)
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Roles updated.")
	return c.Redirect(http.StatusSeeOther, userPath(c, id))
}
