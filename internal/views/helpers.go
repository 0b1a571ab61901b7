// Package views holds the templ components and pages. Views take plain view
// structs prepared by handlers; they never touch the database.
package views

import (
	"net/http"
	"time"
)

func statusTitle(status int) string {
	switch status {
	case http.StatusNotFound:
		return "Not found"
	case http.StatusForbidden:
		return "Not allowed"
	case http.StatusUnauthorized:
		return "Sign-in required"
	case http.StatusTooManyRequests:
		return "Slow down"
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return "Check your input"
	case http.StatusServiceUnavailable:
		return "Temporarily unavailable"
	}
	if status >= 500 {
		return "Something went wrong"
	}
	return http.StatusText(status)
}

// When formats a time for tables: UTC, minute precision, machine-readable
// in the datetime attribute.
func When(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}

func iso(t time.Time) string { return t.UTC().Format(time.RFC3339) }
