package handlers

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/e2b"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/views"
)

// errorBody is the JSON error envelope of every API error.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string            `json:"code"`
	Message string            `json:"message"`
	Fields  map[string]string `json:"fields,omitempty"`
	// retryAfter (seconds) is sent as the Retry-After header, not in the
	// body.
	retryAfter int
}

// classify maps any error to status and a message safe to show. This is the
// one place errors get their HTTP meaning.
func classify(err error) (int, errorDetail) {
	var ve *apperr.ValidationError
	var ae *apperr.Error
	var he *echo.HTTPError
	switch {
	case errors.As(err, &ve):
		return http.StatusBadRequest, errorDetail{Code: "validation_failed", Message: "Some fields are invalid: " + joinFields(ve.Fields), Fields: ve.Fields}
	case errors.As(err, &ae):
		return statusOf(ae.Kind), errorDetail{Code: ae.Code, Message: ae.Message, retryAfter: ae.RetryAfterSeconds()}
	case errors.Is(err, auth.ErrInvalidToken):
		return http.StatusUnauthorized, errorDetail{Code: "unauthenticated", Message: "Sign in again: the credentials are invalid or have expired."}
	case errors.As(err, &he):
		msg, _ := he.Message.(string)
		if msg == "" {
			msg = http.StatusText(he.Code)
		}
		return he.Code, errorDetail{Code: codeOf(he.Code), Message: msg}
	}
	for _, k := range []error{apperr.ErrNotFound, apperr.ErrConflict, apperr.ErrForbidden, apperr.ErrUnauthorized, apperr.ErrSuspended, apperr.ErrTooMany, apperr.ErrInvalid, apperr.ErrUnavailable, apperr.ErrUpstream} {
		if errors.Is(err, k) {
			st := statusOf(k)
			return st, errorDetail{Code: codeOf(st), Message: http.StatusText(st)}
		}
	}
	return http.StatusInternalServerError, errorDetail{Code: "internal", Message: "Something went wrong on our side; it has been logged."}
}

func joinFields(f map[string]string) string {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	return strings.Join(sorted(keys), ", ")
}

func statusOf(kind error) int {
	switch kind {
	case apperr.ErrNotFound:
		return http.StatusNotFound
	case apperr.ErrConflict:
		return http.StatusConflict
	case apperr.ErrForbidden, apperr.ErrSuspended:
		return http.StatusForbidden
	case apperr.ErrUnauthorized:
		return http.StatusUnauthorized
	case apperr.ErrTooMany:
		return http.StatusTooManyRequests
	case apperr.ErrInvalid:
		return http.StatusBadRequest
	case apperr.ErrUnavailable:
		return http.StatusServiceUnavailable
	case apperr.ErrUpstream:
		return http.StatusBadGateway
	}
	return http.StatusInternalServerError
}

func codeOf(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "bad_request"
	case http.StatusUnauthorized:
		return "unauthenticated"
	case http.StatusForbidden:
		return "forbidden"
	case http.StatusNotFound:
		return "not_found"
	case http.StatusMethodNotAllowed:
		return "method_not_allowed"
	case http.StatusConflict:
		return "conflict"
	case http.StatusRequestEntityTooLarge:
		return "body_too_large"
	case http.StatusTooManyRequests:
		return "too_many_requests"
	case http.StatusServiceUnavailable:
		return "unavailable"
	}
	if status >= 500 {
		return "internal"
	}
	return "error"
}

// wantsJSON decides the error format: API paths and JSON clients get the
// envelope, browsers get a page.
func wantsJSON(c echo.Context) bool {
	r := c.Request()
	return strings.HasPrefix(r.URL.Path, "/api/") || strings.HasPrefix(r.URL.Path, "/downloads/") || strings.Contains(r.Header.Get(echo.HeaderAccept), "application/json") && !strings.Contains(r.Header.Get(echo.HeaderAccept), "text/html")
}

// statusCallerLeft answers a request whose caller hung up before it ended.
const statusCallerLeft = 499

func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	if database, ok := s.outage(c, err); ok {
		s.answerOutage(c, database, err)
		return
	}
	if errors.Is(err, context.Canceled) && c.Request().Context().Err() != nil {
		// The caller hung up: nobody reads the answer and the server is
		// not at fault, so no error is logged (499, as nginx says it).
		s.Logger.Debug("caller left", "method", c.Request().Method, "path", c.Path(), "request_id", requestID(c))
		c.Response().WriteHeader(statusCallerLeft)
		return
	}
	status, body := classify(err)
	switch {
	case status == http.StatusServiceUnavailable && body.retryAfter > 0:
		// A refusal that tells the caller when to come back (a busy
		// replica) is the server working as meant; a flood of them must
		// not read as a flood of failures.
		s.Logger.Warn("request refused as busy", "method", c.Request().Method, "path", c.Path(), "request_id", requestID(c), "code", body.Code)
	case status >= 500:
		s.Logger.Error("request failed", "method", c.Request().Method, "path", c.Path(), "request_id", requestID(c), "error", err)
	}
	if body.retryAfter > 0 {
		c.Response().Header().Set("Retry-After", strconv.Itoa(body.retryAfter))
	}
	if strings.HasPrefix(c.Request().URL.Path, "/e2b/") {
		// The E2B SDKs read {"code": <status>, "message"}.
		e2b.WriteError(c, status, body.Message)
		return
	}
	if wantsJSON(c) {
		_ = c.JSON(status, errorBody{Error: body})
		return
	}
	if status == http.StatusUnauthorized && c.Request().Method == http.MethodGet {
		_ = c.Redirect(http.StatusSeeOther, s.loginURLFor(c))
		return
	}
	page := s.page(c, "Error")
	if tenantOf(c) != nil {
		page = s.orgPage(c, "Error")
	}
	_ = render(c, status, views.ErrorPage(page, status, body.Message))
}

// retryAfterSeconds is what an outage answer asks clients to wait.
const retryAfterSeconds = "5"

// outage tells whether err means a database is down, and which: the orgs
// package names it; otherwise the catalog and the request's org database
// are pinged to name it. A refusal the server or driver spelled out
// (store.Refused) is an outage even when both pings pass (a database that
// stopped accepting connections keeps the pooled ones alive); a bare
// connection end (store.MaybeOutage) is one only when a ping fails, so a
// query that merely failed is never passed off as an outage.
func (s *Server) outage(c echo.Context, err error) (string, bool) {
	var ue *orgs.UnavailableError
	if errors.As(err, &ue) {
		return ue.Database, true
	}
	kind := store.Classify(err)
	if kind == store.NotOutage {
		return "", false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), time.Second)
	defer cancel()
	if pingErr := ping(ctx, s.Catalog); pingErr != nil {
		return "catalog", true
	}
	t := tenantOf(c)
	if t != nil && ping(ctx, t.DB) != nil {
		return "org " + t.Org.Slug, true
	}
	if kind != store.Refused {
		return "", false
	}
	if t != nil {
		return "org " + t.Org.Slug, true
	}
	return "catalog", true
}

func ping(ctx context.Context, db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.PingContext(ctx)
}

// answerOutage answers while a database is down: 503 database_unavailable
// with Retry-After for the API, a plain page (no navigation that would need
// the database) for browsers. The log names the database.
func (s *Server) answerOutage(c echo.Context, database string, err error) {
	s.Logger.Error("database unavailable", "database", database, "method", c.Request().Method, "path", c.Path(),
		"request_id", requestID(c), "error", err)
	c.Response().Header().Set("Retry-After", retryAfterSeconds)
	msg := "The database is unavailable; try again in a moment."
	if strings.HasPrefix(database, "org ") {
		msg = "This organization's database is unavailable; try again in a moment."
	}
	if strings.HasPrefix(c.Request().URL.Path, "/e2b/") {
		e2b.WriteError(c, http.StatusServiceUnavailable, msg)
		return
	}
	if wantsJSON(c) {
		_ = c.JSON(http.StatusServiceUnavailable, errorBody{Error: errorDetail{Code: "database_unavailable", Message: msg}})
		return
	}
	csrf, _ := c.Get(ctxCSRF).(string)
	_ = render(c, http.StatusServiceUnavailable, views.ErrorPage(views.Page{Title: "Database unavailable", CSRF: csrf}, http.StatusServiceUnavailable, msg))
}
