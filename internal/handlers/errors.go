package handlers

import (
	"errors"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/auth"
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
		return statusOf(ae.Kind), errorDetail{Code: ae.Code, Message: ae.Message}
	case errors.Is(err, auth.ErrInvalidToken):
		return http.StatusUnauthorized, errorDetail{Code: "unauthenticated", Message: "Sign in again: the credentials are invalid or have expired."}
	case errors.As(err, &he):
		msg, _ := he.Message.(string)
		if msg == "" {
			msg = http.StatusText(he.Code)
		}
		return he.Code, errorDetail{Code: codeOf(he.Code), Message: msg}
	}
	for _, k := range []error{apperr.ErrNotFound, apperr.ErrConflict, apperr.ErrForbidden, apperr.ErrUnauthorized, apperr.ErrSuspended, apperr.ErrTooMany, apperr.ErrInvalid, apperr.ErrUnavailable} {
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
	return strings.HasPrefix(r.URL.Path, "/api/") || strings.Contains(r.Header.Get(echo.HeaderAccept), "application/json") && !strings.Contains(r.Header.Get(echo.HeaderAccept), "text/html")
}

func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status, body := classify(err)
	if status >= 500 {
		s.Logger.Error("request failed", "method", c.Request().Method, "path", c.Path(), "request_id", c.Response().Header().Get(echo.HeaderXRequestID), "error", err)
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
