package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// revealCookie carries a secret that is shown once (a new API key, a
// one-time password, a generated agentd token) across the redirect that
// follows the POST which made it, so every form posts, redirects and is
// then read with GET: reloading the page never creates a second key or
// resets a password again. The agentd token is taken on first read
// (takeReveal); passwords and keys are kept until dismissed (keptReveal).
const revealCookie = "gh_reveal"

// revealAD binds a stashed secret to the page it is for and to who asked
// for it, so a copied cookie shows nothing anywhere else.
func revealAD(c echo.Context, path string) string {
	sub := ""
	if p := principalOf(c); p != nil {
		sub = p.Subject
	}
	return "reveal\x00" + path + "\x00" + sub
}

// revealKeepSeconds is how long a kept secret (a one-time password, a new
// API key) stays on its page when nobody dismisses it: long enough to
// give roles or send an email, short enough not to linger on a screen.
const revealKeepSeconds = 15 * 60

// stashReveal seals secret into a short-lived cookie scoped to path, the
// page that shows it next.
func (s *Server) stashReveal(c echo.Context, path, secret string) error {
	v, err := s.Box.Seal([]byte(secret), revealAD(c, path))
	if err != nil {
		return err
	}
	c.SetCookie(&http.Cookie{Name: revealCookie, Value: v, Path: path, HttpOnly: true,
		Secure: s.SecureCookies, SameSite: http.SameSiteStrictMode, MaxAge: revealKeepSeconds})
	return nil
}

// keptReveal returns the secret stashed for path and leaves it there, so
// the page keeps showing it across the actions that follow (giving the
// new user a role redirects back here) until dismissReveal or
// revealKeepSeconds. The secret never travels in a URL or a form.
func (s *Server) keptReveal(c echo.Context, path string) string {
	ck, err := c.Cookie(revealCookie)
	if err != nil || ck.Value == "" {
		return ""
	}
	b, err := s.Box.Open(ck.Value, revealAD(c, path))
	if err != nil {
		return ""
	}
	return string(b)
}

// dismissReveal is the Dismiss button beside a kept secret: it clears
// the cookie and returns to the page (path), which no longer shows it.
func (s *Server) dismissReveal(path func(echo.Context) (string, error)) echo.HandlerFunc {
	return func(c echo.Context) error {
		p, err := path(c)
		if err != nil {
			return err
		}
		c.SetCookie(&http.Cookie{Name: revealCookie, Value: "", Path: p, MaxAge: -1, HttpOnly: true,
			Secure: s.SecureCookies, SameSite: http.SameSiteStrictMode})
		return c.Redirect(http.StatusSeeOther, p)
	}
}

// takeReveal returns the secret stashed for path, once: the cookie is
// cleared as it is read.
func (s *Server) takeReveal(c echo.Context, path string) string {
	ck, err := c.Cookie(revealCookie)
	if err != nil || ck.Value == "" {
		return ""
	}
	c.SetCookie(&http.Cookie{Name: revealCookie, Value: "", Path: path, MaxAge: -1, HttpOnly: true,
		Secure: s.SecureCookies, SameSite: http.SameSiteStrictMode})
	b, err := s.Box.Open(ck.Value, revealAD(c, path))
	if err != nil {
		return ""
	}
	return string(b)
}
