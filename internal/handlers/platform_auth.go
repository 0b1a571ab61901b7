package handlers

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/platform"
	"github.com/gatehouse/gatehouse/internal/views"
)

// platformEvent appends to the platform audit log with the request's
// actor, address and agent filled in.
func (s *Server) platformEvent(c echo.Context, actor audit.Actor, action string, target audit.Target, decision string, details any) error {
	return s.appendTo(c, s.PlatformAudit, "platform", requestEvent(c, actor, action, target, decision, details))
}

// requestEvent is an audit event of the current request: who, from where,
// with which client.
func requestEvent(c echo.Context, actor audit.Actor, action string, target audit.Target, decision string, details any) audit.Event {
	return audit.Event{Actor: actor, SourceIP: c.RealIP(), UserAgent: c.Request().UserAgent(), Action: action,
		Target: target, Decision: decision, Details: audit.Details(details)}
}

// appendTo appends e to log on its own, with a deadline of its own so the
// record of an action already taken is written even if the client left.
func (s *Server) appendTo(c echo.Context, log *audit.Log, name string, e audit.Event) error {
	ctx, cancel := detached(c.Request().Context())
	defer cancel()
	_, err := log.Append(ctx, e)
	if err != nil {
		s.Logger.Error("audit append failed", "log", name, "action", e.Action, "error", err)
	}
	return err
}

type loginRequest struct {
	Email    string `json:"email"`
	Password string `json:"password"`
}

type loginResponse struct {
	Token              string    `json:"token"`
	ExpiresAt          time.Time `json:"expires_at"`
	MustChangePassword bool      `json:"must_change_password"`
}

// login runs a platform sign-in and audits it either way.
func (s *Server) login(c echo.Context, email, password string) (platform.Login, error) {
	res, err := s.Platform.Login(c.Request().Context(), email, password, c.RealIP())
	if err != nil {
		reason := "bad_credentials"
		var ae *apperr.Error
		if errors.As(err, &ae) {
			reason = ae.Code
		}
		_ = s.platformEvent(c, audit.Actor{Type: audit.ActorAnonymous, Name: auth.NormalizeEmail(email)}, "platform.login",
			audit.Target{Type: "platform"}, audit.Deny, map[string]string{"reason": reason})
		return res, err
	}
	if err := s.platformEvent(c, audit.Actor{Type: audit.ActorPlatformAdmin, ID: itoa(res.Admin.ID), Name: res.Admin.Email},
		"platform.login", audit.Target{Type: "platform"}, audit.Allow, nil); err != nil {
		return platform.Login{}, err
	}
	return res, nil
}

func (s *Server) apiLogin(c echo.Context) error {
	var req loginRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	res, err := s.login(c, req.Email, req.Password)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, loginResponse{Token: res.Token, ExpiresAt: res.ExpiresAt, MustChangePassword: res.Admin.MustChangePassword})
}

func (s *Server) apiLogout(c echo.Context) error {
	p := principalOf(c)
	if err := s.Platform.Logout(c.Request().Context(), p.LoginID); err != nil {
		return err
	}
	_ = s.platformEvent(c, p.AuditActor(), "platform.logout", audit.Target{Type: "platform"}, audit.Allow, nil)
	return c.NoContent(http.StatusNoContent)
}

type passwordRequest struct {
	Current string `json:"current_password"`
	New     string `json:"new_password"`
}

// apiPasswordFields names a password change's invalid fields as the JSON
// request does (current_password, new_password); the domain names them as
// the pages' forms do (current, new). Any other error is returned as is.
func apiPasswordFields(err error) error {
	var ve *apperr.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	out := apperr.Validation()
	for field, msg := range ve.Fields {
		switch field {
		case "current":
			field = "current_password"
		case "new":
			field = "new_password"
		}
		out.Add(field, "%s", msg)
	}
	return out
}

func (s *Server) changePassword(c echo.Context, current, next string) error {
	p := principalOf(c)
	if err := s.Platform.ChangePassword(c.Request().Context(), p.ID, current, next); err != nil {
		return err
	}
	return s.platformEvent(c, p.AuditActor(), "platform.password_change", audit.Target{Type: audit.ActorPlatformAdmin, ID: p.ID, Name: p.Name}, audit.Allow, nil)
}

func (s *Server) apiChangePassword(c echo.Context) error {
	var req passwordRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if err := s.changePassword(c, req.Current, req.New); err != nil {
		return apiPasswordFields(err)
	}
	return c.NoContent(http.StatusNoContent)
}

// page builds the common page state for the platform console.
func (s *Server) page(c echo.Context, title string) views.Page {
	csrf, _ := c.Get(ctxCSRF).(string)
	p := views.Page{Title: title, CSRF: csrf, Flash: s.takeFlash(c), LogoutURL: "/logout"}
	if pr := principalOf(c); pr != nil {
		p.User = pr.Name
		if pr.Kind == audit.ActorPlatformAdmin && !pr.MustChangePassword {
			path := c.Path()
			p.Nav = []views.NavItem{
				{Label: "Organizations", Href: "/admin/orgs", Active: len(path) >= 11 && path[:11] == "/admin/orgs"},
				{Label: "Platform audit log", Href: "/admin/audit", Active: path == "/admin/audit"},
			}
		}
	}
	return p
}

func (s *Server) pageLogin(c echo.Context) error {
	return render(c, http.StatusOK, views.Login(s.page(c, "Sign in"), platformLoginForm(c.QueryParam("next"))))
}

func (s *Server) pageLoginSubmit(c echo.Context) error {
	email, next := c.FormValue("email"), c.FormValue("next")
	res, err := s.login(c, email, c.FormValue("password"))
	if err != nil {
		status, body := classify(err)
		if status >= 500 {
			return err
		}
		f := platformLoginForm(next)
		f.Email, f.Error = email, body.Message
		if errors.Is(err, apperr.ErrUnauthorized) {
			f.Error += orgLoginHint
		}
		return render(c, status, views.Login(s.page(c, "Sign in"), f))
	}
	s.setLoginCookie(c, platformCookie, res.Token, res.ExpiresAt)
	if res.Admin.MustChangePassword {
		return c.Redirect(http.StatusSeeOther, "/admin/password")
	}
	return c.Redirect(http.StatusSeeOther, safeNext(next, "/admin/orgs"))
}

func (s *Server) setLoginCookie(c echo.Context, name, token string, exp time.Time) {
	c.SetCookie(&http.Cookie{Name: name, Value: token, Path: "/", Expires: exp, HttpOnly: true,
		Secure: s.SecureCookies, SameSite: http.SameSiteLaxMode})
}

func (s *Server) clearCookie(c echo.Context, name string) {
	c.SetCookie(&http.Cookie{Name: name, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: s.SecureCookies, SameSite: http.SameSiteLaxMode})
}

func (s *Server) pageLogout(c echo.Context) error {
	p := principalOf(c)
	if err := s.Platform.Logout(c.Request().Context(), p.LoginID); err != nil {
		return err
	}
	_ = s.platformEvent(c, p.AuditActor(), "platform.logout", audit.Target{Type: "platform"}, audit.Allow, nil)
	s.clearCookie(c, platformCookie)
	return c.Redirect(http.StatusSeeOther, "/login")
}

func (s *Server) pagePassword(c echo.Context) error {
	return render(c, http.StatusOK, views.ChangePassword(s.page(c, "Change password"),
		views.PasswordForm{Action: "/admin/password", Required: principalOf(c).MustChangePassword}))
}

func (s *Server) pagePasswordSubmit(c echo.Context) error {
	err := s.changePassword(c, c.FormValue("current"), c.FormValue("new"))
	var ve *apperr.ValidationError
	if errors.As(err, &ve) {
		pr := principalOf(c)
		return render(c, http.StatusBadRequest, views.ChangePassword(s.page(c, "Change password"),
			views.PasswordForm{Action: "/admin/password", Required: pr.MustChangePassword, Errors: ve.Fields}))
	}
	if err != nil {
		return err
	}
	s.setFlash(c, "Your password was changed.")
	return c.Redirect(http.StatusSeeOther, "/admin/orgs")
}

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// readyz is in readiness.go.
