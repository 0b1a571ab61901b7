package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	sqlite "github.com/glebarez/go-sqlite"
	"github.com/jackc/pgx/v5/pgconn"
)

// Outage says how sure Classify is that an error means a database could
// not be used, as opposed to a query that was wrong.
type Outage int

const (
	// NotOutage is any other failure: a bug, a constraint, a bad query.
	NotOutage Outage = iota
	// MaybeOutage is a network failure the database driver did not
	// claim (a bare refused dial, EOF, a reset or failed read or write, a
	// pool's bad connection): the database may be down, one connection
	// may have died, or the failure was another service's (agentd). Callers
	// that must not pass a bug off as an outage check the database
	// before saying so.
	MaybeOutage
	// Refused is the server or the driver saying that no connection can
	// be had or kept now: a connection exception (SQLSTATE class 08),
	// too_many_connections (53300), admin or crash shutdown (57P01,
	// 57P02), cannot_connect_now (57P03), a database not accepting
	// connections (55000 while connecting), the driver's failed dial
	// (pgconn.ConnectError), or an SQLite file that cannot be opened or
	// read.
	Refused
)

// Classify is the one place a database failure is told from a query
// failure, by SQLSTATE and by the driver's typed errors, never by message
// text: whether an answer is "503 database_unavailable" or a 500 hangs on
// it, for the catalog and the org databases alike.
func Classify(err error) Outage {
	if err == nil {
		return NotOutage
	}
	// A failed connection attempt: the server's own refusal decides when
	// it gave one; a refusal about credentials or a missing database is a
	// configuration error, not an outage.
	var connErr *pgconn.ConnectError
	var pgErr *pgconn.PgError
	if errors.As(err, &connErr) {
		if errors.Is(connErr, context.Canceled) {
			// The caller gave up while the connection was being made.
			return NotOutage
		}
		if errors.As(connErr, &pgErr) {
			if refusedState(pgErr.Code, true) {
				return Refused
			}
			return NotOutage
		}
		return Refused
	}
	var sqlState interface{ SQLState() string }
	if errors.As(err, &sqlState) {
		if refusedState(sqlState.SQLState(), false) {
			return Refused
		}
		return NotOutage
	}
	var opErr *net.OpError
	var sqliteErr *sqlite.Error
	switch {
	case errors.As(err, &sqliteErr):
		// Primary result codes (the low byte of an extended code):
		// SQLITE_IOERR 10, SQLITE_CANTOPEN 14.
		if c := sqliteErr.Code() & 0xff; c == 10 || c == 14 {
			return Refused
		}
		return NotOutage
	case errors.As(err, &opErr), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.Is(err, driver.ErrBadConn), errors.Is(err, pgconn.ErrConnClosed),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		// A bare network error may come from anything the request
		// reached (agentd, a sandbox backend), not only a database.
		return MaybeOutage
	}
	return NotOutage
}

// refusedState reports whether a SQLSTATE means the server will not serve
// a connection now. 55000 (object_not_in_prerequisite_state) is an outage
// only while connecting ("database is not currently accepting
// connections"); later it is a statement used wrongly.
func refusedState(code string, connecting bool) bool {
	switch {
	case strings.HasPrefix(code, "08"):
		return true
	case code == "53300", code == "57P01", code == "57P02", code == "57P03":
		return true
	case code == "55000":
		return connecting
	}
	return false
}

// IsUnavailable reports whether err means the database could not be
// reached (refused, reset, shut down, file gone) rather than that a query
// was wrong: Classify says Refused or MaybeOutage. Callers answer such
// failures as an outage, not as a bug.
func IsUnavailable(err error) bool { return Classify(err) != NotOutage }
