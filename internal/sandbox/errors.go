package sandbox

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Sentinel errors for backend answers that callers act on. Match them with
// errors.Is; the *APIError behind them keeps the backend's own words.
var (
	ErrNotFound     = errors.New("sandbox: not found")
	ErrConflict     = errors.New("sandbox: conflict")
	ErrUnauthorized = errors.New("sandbox: unauthorized")
	ErrRateLimited  = errors.New("sandbox: rate limited")
	ErrUnavailable  = errors.New("sandbox: backend unavailable")
	ErrBadRequest   = errors.New("sandbox: bad request")
)

// APIError is an error answer from a backend, in E2B's shape
// {"code":int,"message":string,"error_code"?:string}.
type APIError struct {
	// Status is the HTTP status of the answer.
	Status int
	// Code is the body's "code" (usually equal to Status).
	Code    int
	Message string
	// ErrorCode is the machine-readable reason newer servers add, e.g.
	// sandbox_capacity_unavailable.
	ErrorCode string
	// RetryAfter is the server's Retry-After hint, zero when absent.
	RetryAfter time.Duration
	// Op names the call that failed, e.g. "POST /sandboxes/{id}/pause".
	Op string
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	s := fmt.Sprintf("%s: backend answered %d: %s", e.Op, e.Status, msg)
	if e.ErrorCode != "" {
		s += " (" + e.ErrorCode + ")"
	}
	return s
}

// Unwrap exposes the sentinel for the status, so errors.Is(err, ErrNotFound)
// works on a wrapped *APIError.
func (e *APIError) Unwrap() error { return KindForStatus(e.Status) }

// KindForStatus maps an HTTP status to the sentinel error callers act on,
// or nil when there is none (e.g. 500).
func KindForStatus(status int) error {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return ErrBadRequest
	case http.StatusUnauthorized, http.StatusForbidden:
		return ErrUnauthorized
	case http.StatusNotFound, http.StatusGone:
		return ErrNotFound
	case http.StatusConflict:
		return ErrConflict
	case http.StatusTooManyRequests:
		return ErrRateLimited
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return ErrUnavailable
	}
	return nil
}
