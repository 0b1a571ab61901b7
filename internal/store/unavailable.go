package store

import (
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
)

// IsUnavailable reports whether err means the database could not be
// reached (refused, reset, shut down, file gone) rather than that a query
// was wrong. Callers answer such failures as an outage, not as a bug.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var opErr *net.OpError
	var sqlState interface{ SQLState() string }
	switch {
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), errors.As(err, &opErr):
		return true
	case errors.As(err, &sqlState):
		// Class 08 is "connection exception"; 57P01-03 are the server
		// shutting down or starting up.
		code := sqlState.SQLState()
		return strings.HasPrefix(code, "08") || code == "57P01" || code == "57P02" || code == "57P03"
	}
	// Drivers that flatten their errors to text (pgx's connect errors,
	// SQLite's open failures).
	msg := err.Error()
	for _, s := range []string{"failed to connect to", "connection refused", "server closed the connection unexpectedly",
		"conn closed", "unable to open database file", "disk I/O error"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
