package handlers

import (
	"errors"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/views"
)

// absURL is path at the console's public address (--base-url), or at the
// address the request came to when none is configured.
func (s *Server) absURL(c echo.Context, path string) string {
	base := strings.TrimRight(s.BaseURL, "/")
	if base == "" {
		base = c.Scheme() + "://" + c.Request().Host
	}
	return base + path
}

// orgSignInURL is where an organization's users sign in: what admins hand
// out with each new account.
func (s *Server) orgSignInURL(c echo.Context, slug string) string {
	return s.absURL(c, "/o/"+slug+"/login")
}

// platformLoginForm is the platform sign-in page, which also leads
// organization accounts to their organization's own.
func platformLoginForm(next string) views.LoginForm {
	return views.LoginForm{Action: "/login", Heading: "Sign in to Gatehouse", Next: next, OrgFinder: true}
}

// orgLoginHint ends a refused platform sign-in's message: the account may
// well exist, in an organization, and this says where without checking.
const orgLoginHint = " This page is for platform administrators: if your account belongs to an organization, sign in to it below."

// pageFindOrgLogin sends someone to the sign-in page of the organization
// they name (its slug, or its sign-in address pasted whole). Nothing about
// accounts is looked up; an unknown organization is said to be unknown,
// as its own address would.
func (s *Server) pageFindOrgLogin(c echo.Context) error {
	raw := strings.TrimSpace(c.QueryParam("org"))
	slug := strings.ToLower(raw)
	if _, rest, ok := strings.Cut(slug, "/o/"); ok {
		slug, _, _ = strings.Cut(rest, "/")
	}
	msg, status := "", http.StatusBadRequest
	if orgs.ValidateSlug(slug) != "" {
		msg = "Enter the organization's short name as it appears in its sign-in address: acme in …/o/acme/login."
	} else if _, err := s.Orgs.Get(c.Request().Context(), slug); errors.Is(err, apperr.ErrNotFound) {
		msg, status = "No organization is called \""+slug+"\". Check the spelling, or ask whoever gave you your account for its sign-in address.", http.StatusNotFound
	} else if err != nil {
		return err
	}
	if msg != "" {
		f := platformLoginForm("")
		f.Org, f.OrgError = raw, msg
		return render(c, status, views.Login(s.page(c, "Sign in"), f))
	}
	return c.Redirect(http.StatusSeeOther, "/o/"+slug+"/login")
}
