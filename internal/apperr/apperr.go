// Package apperr holds the application's error kinds. Domain packages return
// these; the HTTP layer maps them to status codes in one place, so a domain
// package never needs to know about HTTP.
package apperr

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Kinds of failure. Wrap them with New or match them with errors.Is.
var (
	ErrNotFound     = errors.New("not found")
	ErrConflict     = errors.New("conflict")
	ErrForbidden    = errors.New("forbidden")
	ErrUnauthorized = errors.New("unauthorized")
	ErrSuspended    = errors.New("organization suspended")
	ErrTooMany      = errors.New("too many requests")
	ErrInvalid      = errors.New("invalid input")
	ErrUnavailable  = errors.New("unavailable")
	// ErrUpstream is a failure of a system behind the console (agentd, a
	// sandbox backend) that the caller can do nothing about but retry.
	ErrUpstream = errors.New("upstream failed")
)

// Error is a failure whose message is safe to show to the caller.
type Error struct {
	Kind    error
	Code    string
	Message string
	// RetryAfter, when set, is how soon trying again may succeed: the
	// failure is a passing shortage (a busy replica), not a fault.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Message }

// Unwrap lets errors.Is match the kind.
func (e *Error) Unwrap() error { return e.Kind }

// RetryAfterSeconds is RetryAfter in whole seconds, rounded up so that a
// hint under a second does not read as "at once"; 0 when not set.
func (e *Error) RetryAfterSeconds() int {
	if e.RetryAfter <= 0 {
		return 0
	}
	return int((e.RetryAfter + time.Second - 1) / time.Second)
}

// New returns an Error of kind with a stable machine code and a full-sentence
// message for people.
func New(kind error, code, format string, args ...any) *Error {
	return &Error{Kind: kind, Code: code, Message: fmt.Sprintf(format, args...)}
}

// ValidationError lists what is wrong with each field.
type ValidationError struct {
	Fields map[string]string
}

// Validation starts an empty ValidationError; use Add and Err.
func Validation() *ValidationError { return &ValidationError{Fields: map[string]string{}} }

// Add records a problem with field; the first problem per field wins.
func (v *ValidationError) Add(field, format string, args ...any) {
	if _, ok := v.Fields[field]; !ok {
		v.Fields[field] = fmt.Sprintf(format, args...)
	}
}

// Err returns v when it holds problems, else nil.
func (v *ValidationError) Err() error {
	if len(v.Fields) == 0 {
		return nil
	}
	return v
}

func (v *ValidationError) Error() string {
	keys := make([]string, 0, len(v.Fields))
	for k := range v.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ": " + v.Fields[k]
	}
	return "invalid input: " + strings.Join(parts, "; ")
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (v *ValidationError) Unwrap() error { return ErrInvalid }
