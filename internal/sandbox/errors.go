package sandbox

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Sentinel errors for backend answers that callers act on. Match them with
// errors.Is; the *APIError behind an answer keeps the backend's own words.
var (
	ErrNotFound     = errors.New("sandbox: not found")
	ErrConflict     = errors.New("sandbox: conflict")
	ErrUnauthorized = errors.New("sandbox: unauthorized")
	ErrRateLimited  = errors.New("sandbox: rate limited")
	// ErrUnavailable is a 502, 503 or 504, or a backend that could not be
	// reached at all.
	ErrUnavailable = errors.New("sandbox: backend unavailable")
	ErrBadRequest  = errors.New("sandbox: bad request")
	// ErrServer is a 500 (or another 5xx without a more specific meaning).
	ErrServer = errors.New("sandbox: backend error")
	// ErrAlreadyPaused is Pause's 409; it also matches ErrConflict.
	ErrAlreadyPaused = errors.New("sandbox: already paused")
	// ErrTimeout means no answer arrived in time (the caller's deadline or
	// the HTTP client's timeout). The call may have taken effect.
	ErrTimeout = errors.New("sandbox: no answer in time")
	// ErrMalformed means the backend answered, but not with the API's JSON.
	ErrMalformed = errors.New("sandbox: malformed answer")
	// ErrRedirect means the backend answered with a redirect, which the
	// client never follows (it would carry the API key to another host).
	ErrRedirect = errors.New("sandbox: backend redirected")
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
	if e.RetryAfter > 0 {
		s += fmt.Sprintf("; retry after %s", e.RetryAfter)
	}
	return s
}

// Unwrap exposes the sentinel for the status, so errors.Is(err, ErrNotFound)
// works on a wrapped *APIError.
func (e *APIError) Unwrap() error { return KindForStatus(e.Status) }

// KindForStatus maps an HTTP error status to the sentinel callers act on,
// or nil when there is none.
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
	if status >= 500 && status <= 599 {
		return ErrServer
	}
	return nil
}

// OutcomeUnknown reports whether a failed mutation (create, kill, pause,
// connect) may still have taken effect at the backend: a timeout, a
// malformed answer, a 5xx, a broken connection. Only a definite refusal (a
// 4xx answer, a redirect, a request refused before sending) says it did
// not. After an unknown create, look the sandbox up by its metadata tags
// rather than creating another.
func OutcomeUnknown(err error) bool {
	var ns notSent
	if err == nil || errors.Is(err, ErrRedirect) || errors.As(err, &ns) {
		return false
	}
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status >= 500
	}
	return true
}

// notSent marks errors raised before a request left the client.
type notSent struct{ err error }

func (e notSent) Error() string { return e.err.Error() }
func (e notSent) Unwrap() error { return e.err }

// NotSent marks err as raised before anything was sent, so OutcomeUnknown
// reports false for it.
func NotSent(err error) error { return notSent{err} }
