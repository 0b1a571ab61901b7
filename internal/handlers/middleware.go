package handlers

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/rbac"
)

const maxBodyBytes = 1 << 20

// Cookie names.
const (
	platformCookie = "gh_login"
	// orgCookiePrefix + slug holds an org user's sign-in token.
	orgCookiePrefix = "gh_org_"
	csrfCookie      = "gh_csrf"
	flashCookie     = "gh_flash"
)

// Context keys.
const (
	ctxPrincipal = "gh.principal"
	ctxCSRF      = "gh.csrf"
)

func principalOf(c echo.Context) *authz.Principal {
	p, _ := c.Get(ctxPrincipal).(*authz.Principal)
	return p
}

func (s *Server) recoverer(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler {
					// A handler breaking off a response it began (a
					// file read that failed midway): net/http closes the
					// connection without a word, so the client cannot
					// take the cut body for a whole one.
					panic(r)
				}
				s.Logger.Error("panic", "path", c.Path(), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return next(c)
	}
}

// accessLog logs method, route pattern and status; never query strings,
// bodies or headers, which may carry secrets.
func (s *Server) accessLog(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		status := c.Response().Status
		if err != nil {
			status, _ = classify(err)
		}
		elapsed := time.Since(start)
		s.Logger.Debug("http", "method", c.Request().Method, "route", c.Path(), "status", status,
			"duration_ms", elapsed.Milliseconds(), "remote_ip", c.RealIP())
		s.Metrics.ObserveHTTP(c.Path(), c.Request().Method, status, elapsed)
		return err
	}
}

func securityHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; form-action 'self'")
		return next(c)
	}
}

// route is a method and a route pattern; a struct key, so looking a
// request up costs no allocation on every request.
type route struct{ method, path string }

// limitBody caps every request body; decodeJSON turns the overflow into a
// 400 that says so. The routes in larger ("METHOD /route/:pattern") take
// raw bodies up to their own limit instead, which they enforce themselves
// with a clearer message; the announced length is refused here already.
// The upload routes (org_uploads.go) take one bundle or file, capped here
// too: a page's multipart form is read by the CSRF check before the
// handler runs.
func limitBody(n int64, larger map[string]int64) echo.MiddlewareFunc {
	byRoute := make(map[route]int64, len(larger))
	for k, v := range larger {
		method, path, _ := strings.Cut(k, " ")
		byRoute[route{method, path}] = v
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			limit, own := byRoute[route{r.Method, c.Path()}]
			if !own {
				limit = n
			}
			capped, shown, what := n, limit, ""
			if isUploadRoute(c.Path()) {
				limit, capped, shown, what = maxUploadBody, maxUploadBody, agents.MaxUploadBytes, " per bundle or file"
			}
			if r.ContentLength > limit {
				return apperr.New(apperr.ErrInvalid, "body_too_large", "The request body is larger than the %d MiB limit%s.", shown>>20, what)
			}
			if !own {
				r.Body = http.MaxBytesReader(c.Response(), r.Body, capped)
			}
			return next(c)
		}
	}
}

// csrf implements the double-submit cookie pattern for cookie-authenticated
// requests: every unsafe request that could carry a sign-in cookie must
// echo the CSRF cookie in a form field or header. Requests that carry their
// own Authorization header cannot be forged by another site, and cookies
// are then ignored for authentication.
func (s *Server) csrf(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		token := ""
		if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) >= 20 {
			token = ck.Value
		} else if _, ok := bearer(r); ok {
			// An API client (the gateway's callers): no browser to give a
			// CSRF cookie to, and nothing for it to protect.
			return next(c)
		} else {
			token = auth.RandomToken(24)
			c.SetCookie(&http.Cookie{Name: csrfCookie, Value: token, Path: "/", HttpOnly: true,
				Secure: s.SecureCookies, SameSite: http.SameSiteStrictMode})
		}
		c.Set(ctxCSRF, token)
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			return next(c)
		}
		if _, ok := bearer(r); ok {
			return next(c)
		}
		// An API call without a sign-in cookie carries no ambient authority
		// a forged request could borrow; its own credentials are checked by
		// the route.
		if (strings.HasPrefix(r.URL.Path, "/api/") || strings.HasPrefix(r.URL.Path, "/e2b/")) && !hasLoginCookie(r) {
			return next(c)
		}
		sent := r.Header.Get("X-CSRF-Token")
		switch {
		case sent != "":
		case isMultipart(r):
			sent = leadingCSRF(r)
		case isForm(r):
			// The body only: a token in the query string would end up in
			// logs, histories and Referer headers.
			sent = r.PostFormValue("_csrf")
		}
		if sent == "" || subtle.ConstantTimeCompare([]byte(sent), []byte(token)) != 1 {
			return apperr.New(apperr.ErrForbidden, "csrf_failed",
				"This form has expired or did not come from Gatehouse. Reload the page and try again.")
		}
		return next(c)
	}
}

// maxCSRFPrefix bounds what the CSRF check reads of a multipart body.
const maxCSRFPrefix = 64 << 10

func isMultipart(r *http.Request) bool {
	return strings.HasPrefix(r.Header.Get(echo.HeaderContentType), echo.MIMEMultipartForm)
}

// leadingCSRF reads the _csrf field of a multipart form, which the pages'
// forms send as their first field (browsers send fields in the form's
// order), reading at most maxCSRFPrefix bytes, and puts back what it read
// so the handler sees the whole body. Parsing the whole form here instead
// would read and store an upload's worth of bytes (on disk past 32 MiB,
// and without any cap on routes that bound their own bodies) for anyone
// at all, before the route knows who sent it.
func leadingCSRF(r *http.Request) string {
	_, params, err := mime.ParseMediaType(r.Header.Get(echo.HeaderContentType))
	if err != nil || params["boundary"] == "" {
		return ""
	}
	var seen bytes.Buffer
	mr := multipart.NewReader(io.TeeReader(io.LimitReader(r.Body, maxCSRFPrefix), &seen), params["boundary"])
	value := ""
	if p, err := mr.NextPart(); err == nil && p.FormName() == "_csrf" && p.FileName() == "" {
		if b, err := io.ReadAll(io.LimitReader(p, 256)); err == nil {
			value = string(b)
		}
	}
	r.Body = replayedBody{io.MultiReader(bytes.NewReader(seen.Bytes()), r.Body), r.Body}
	return value
}

// replayedBody is a request body with its first bytes read and put back.
type replayedBody struct {
	io.Reader
	io.Closer
}

// hasLoginCookie reports whether the browser sent any sign-in cookie.
func hasLoginCookie(r *http.Request) bool {
	for _, ck := range r.Cookies() {
		if ck.Name == platformCookie || strings.HasPrefix(ck.Name, orgCookiePrefix) {
			return true
		}
	}
	return false
}

func isForm(r *http.Request) bool {
	ct := r.Header.Get(echo.HeaderContentType)
	return strings.HasPrefix(ct, echo.MIMEApplicationForm) || strings.HasPrefix(ct, echo.MIMEMultipartForm)
}

// errNotBearer refuses Authorization schemes other than Bearer.
var errNotBearer = apperr.New(apperr.ErrUnauthorized, "unsupported_authorization",
	"Only \"Authorization: Bearer <token or API key>\" is accepted.")

// errEmptyBearer refuses "Authorization: Bearer" with nothing after it:
// what a shell sends for "Bearer $KEY" when KEY is unset.
var errEmptyBearer = apperr.New(apperr.ErrUnauthorized, "unauthenticated",
	"The Authorization header says Bearer but holds no token: the variable you meant to send (such as $GATEHOUSE_API_KEY) is probably empty.")

// badAuthorization is the refusal of an Authorization header that bearer
// did not accept.
func badAuthorization(r *http.Request) error {
	scheme, _, _ := strings.Cut(strings.TrimSpace(r.Header.Get(echo.HeaderAuthorization)), " ")
	if strings.EqualFold(scheme, "Bearer") {
		return errEmptyBearer
	}
	return errNotBearer
}

// bearer returns the Authorization bearer credential, if any. The scheme is
// case-insensitive (RFC 9110).
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get(echo.HeaderAuthorization)
	if h == "" {
		return "", false
	}
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// authorize is attached to every route with the route's declared
// permission. Deny is the default: only a matching rule lets a request on.
// It is also the one place text inputs are checked: path parameters
// before anything looks them up, the query, form and JSON body once the
// route's authorization passed (textChecked).
func (s *Server) authorize(sf surface, perm rbac.Perm) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		next = s.textChecked(sf, next)
		return func(c echo.Context) error {
			if p := pathParamsProblem(c); p != nil {
				return p.err()
			}
			if sf == orgSurface {
				return s.authorizeOrg(c, perm, next)
			}
			if sf == e2bSurface {
				return s.authorizeE2B(c, next)
			}
			if perm.Scope == rbac.ScopePublic {
				return next(c)
			}
			p, err := s.platformPrincipal(c)
			if err != nil {
				return err
			}
			c.Set(ctxPrincipal, p)
			if p.MustChangePassword && perm.Scope != rbac.ScopeOwnLogin {
				if !wantsJSON(c) && c.Request().Method == http.MethodGet {
					return c.Redirect(http.StatusSeeOther, "/admin/password")
				}
				return apperr.New(apperr.ErrForbidden, "password_change_required",
					"You signed in with a one-time password; change it (POST /api/v1/auth/password) before doing anything else.")
			}
			// Every platform admin holds every platform permission; the
			// declaration still names the object for audit and review.
			return next(c)
		}
	}
}

// platformPrincipal authenticates a platform admin from a bearer token or,
// when none is sent, the sign-in cookie.
func (s *Server) platformPrincipal(c echo.Context) (*authz.Principal, error) {
	r := c.Request()
	tok, hasBearer := bearer(r)
	viaCookie := false
	if !hasBearer && r.Header.Get(echo.HeaderAuthorization) != "" {
		// A browser may send Basic credentials for a proxy on its own;
		// never let them stand in for, or switch off checks on, a cookie.
		return nil, badAuthorization(r)
	}
	if !hasBearer {
		ck, err := r.Cookie(platformCookie)
		if err != nil || ck.Value == "" {
			return nil, apperr.New(apperr.ErrUnauthorized, "unauthenticated", "Sign in to continue.")
		}
		tok, viaCookie = ck.Value, true
	}
	a, claims, err := s.Platform.Authenticate(r.Context(), tok)
	if err != nil {
		if errors.Is(err, auth.ErrInvalidToken) {
			return nil, apperr.New(apperr.ErrUnauthorized, "unauthenticated", "Your sign-in is invalid or has expired; sign in again.")
		}
		return nil, err
	}
	return &authz.Principal{Kind: audit.ActorPlatformAdmin, ID: fmt.Sprint(a.ID), Name: a.Email, LoginID: claims.LoginID,
		MustChangePassword: a.MustChangePassword, ViaCookie: viaCookie}, nil
}

func (s *Server) loginURLFor(c echo.Context) string {
	next := c.Request().URL.RequestURI()
	if org := c.Param("org"); org != "" && strings.HasPrefix(c.Path(), "/o/") {
		return "/o/" + org + "/login?next=" + url.QueryEscape(next)
	}
	return "/login?next=" + url.QueryEscape(next)
}

// safeNext keeps post-login redirects on this site.
func safeNext(next, fallback string) string {
	if next == "" || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") {
		return fallback
	}
	// Browsers drop tabs and newlines and read "\\" as "/", so "/\t/evil"
	// or "/\\evil" would leave the site.
	for _, r := range next {
		if r < 0x21 || r == 0x7f || r == '\\' {
			return fallback
		}
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return fallback
	}
	return next
}

// decodeJSON reads exactly one JSON object into v, refusing unknown fields,
// trailing data and oversize bodies with messages that say which.
func decodeJSON(c echo.Context, v any) error {
	r := c.Request()
	if ct := r.Header.Get(echo.HeaderContentType); ct != "" && !strings.HasPrefix(ct, echo.MIMEApplicationJSON) {
		return apperr.New(apperr.ErrInvalid, "unsupported_content_type", "Send the request body as application/json.")
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return jsonError(err)
		}
		return apperr.New(apperr.ErrInvalid, "malformed_json", "The request body must hold a single JSON object with nothing after it.")
	}
	return nil
}

// jsonCall is the shape of most JSON handlers: decode the request, run do,
// write its result with status. Errors go to the one error handler.
func jsonCall[Req, Resp any](c echo.Context, status int, do func(Req) (Resp, error)) error {
	var req Req
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	resp, err := do(req)
	if err != nil {
		return err
	}
	return c.JSON(status, resp)
}

func jsonError(err error) error {
	var mbe *http.MaxBytesError
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &mbe):
		return apperr.New(apperr.ErrInvalid, "body_too_large", "The request body is larger than the 1 MiB limit.")
	case errors.Is(err, io.EOF):
		return apperr.New(apperr.ErrInvalid, "malformed_json", "The request body is empty; send a JSON object.")
	case errors.As(err, &se):
		return apperr.New(apperr.ErrInvalid, "malformed_json", "The request body is not valid JSON (at byte %d).", se.Offset)
	case errors.As(err, &te):
		return apperr.New(apperr.ErrInvalid, "malformed_json", "%s", apperr.DescribeJSON("The request body", err))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return apperr.New(apperr.ErrInvalid, "unknown_field", "%s", apperr.DescribeJSON("The request", err))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return apperr.New(apperr.ErrInvalid, "malformed_json", "The request body is truncated JSON.")
	}
	return apperr.New(apperr.ErrInvalid, "malformed_json", "The request body could not be read as JSON.")
}

func render(c echo.Context, status int, comp templ.Component) error {
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMETextHTMLCharsetUTF8)
	c.Response().WriteHeader(status)
	return comp.Render(c.Request().Context(), c.Response())
}

// setFlash stores a one-shot message shown on the next page.
func (s *Server) setFlash(c echo.Context, msg string) {
	c.SetCookie(&http.Cookie{Name: flashCookie, Value: url.QueryEscape(msg), Path: "/", HttpOnly: true,
		Secure: s.SecureCookies, SameSite: http.SameSiteLaxMode, MaxAge: 60})
}

func (s *Server) takeFlash(c echo.Context) string {
	ck, err := c.Cookie(flashCookie)
	if err != nil {
		return ""
	}
	c.SetCookie(&http.Cookie{Name: flashCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: s.SecureCookies})
	msg, _ := url.QueryUnescape(ck.Value)
	return msg
}

func sorted(xs []string) []string { sort.Strings(xs); return xs }

// detached gives work that must finish even if the client goes away (the
// audit record of an action already taken) its own deadline.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}
