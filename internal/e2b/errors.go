package e2b

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"connectrpc.com/connect"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/store"
)

// toConnect gives an error its Connect code: the one place the data plane
// maps the console's error kinds, as handlers/errors.go does for HTTP.
// Messages of apperr errors are written for people and safe to show;
// anything else is reported as internal without its text.
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code, msg := classify(err)
	return connect.NewError(code, errors.New(msg))
}

// databaseUnavailableMsg answers a request that met a database outage
// (store.Classify); the caller retries after databaseRetryAfter.
const (
	databaseUnavailableMsg = "The database is unavailable; try again in a moment."
	databaseRetryAfter     = "5"
)

// databaseRefused reports whether err is a database refusing or losing
// connections (store.Refused) that no domain package explained: a bare
// network error may be agentd's, and an apperr already says what it is.
func databaseRefused(err error) bool {
	var ae *apperr.Error
	return !errors.As(err, &ae) && store.Classify(err) == store.Refused
}

func classify(err error) (connect.Code, string) {
	var ve *apperr.ValidationError
	if errors.As(err, &ve) {
		return connect.CodeInvalidArgument, ve.Error()
	}
	if databaseRefused(err) {
		return connect.CodeUnavailable, databaseUnavailableMsg
	}
	msg := "Something went wrong on the console's side; it has been logged."
	var ae *apperr.Error
	if errors.As(err, &ae) {
		msg = ae.Message
	}
	for _, m := range []struct {
		kind error
		code connect.Code
	}{
		{apperr.ErrNotFound, connect.CodeNotFound},
		{apperr.ErrConflict, connect.CodeFailedPrecondition},
		{apperr.ErrForbidden, connect.CodePermissionDenied},
		{apperr.ErrSuspended, connect.CodePermissionDenied},
		{apperr.ErrUnauthorized, connect.CodeUnauthenticated},
		{apperr.ErrTooMany, connect.CodeResourceExhausted},
		{apperr.ErrInvalid, connect.CodeInvalidArgument},
		{apperr.ErrUnavailable, connect.CodeUnavailable},
		{apperr.ErrUpstream, connect.CodeUnavailable},
	} {
		if errors.Is(err, m.kind) {
			if ae == nil {
				msg = m.code.String()
			}
			return m.code, msg
		}
	}
	return connect.CodeInternal, "Something went wrong on the console's side; it has been logged."
}

// httpStatus is a Connect code's HTTP status, as Connect's own protocol
// maps it (used by the REST /files routes).
func httpStatus(code connect.Code) int {
	switch code {
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition:
		return http.StatusBadRequest
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

var connectErrors = connect.NewErrorWriter()

// fail answers a refused or failed request (writeError), logging what the
// caller is not told.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	if code := connect.CodeOf(toConnect(err)); r.Context().Err() == nil && (code == connect.CodeInternal || code == connect.CodeUnavailable) {
		s.logger().Error("e2b data plane request failed", "path", r.URL.Path, "error", err)
	}
	writeError(w, r, err)
}

// writeError answers a request refused before (or outside) the Connect
// handlers: in Connect's error format for RPCs, in envd's REST error
// shape ({"code": <status>, "message"}) for /files.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apperr.Error
	if errors.As(err, &ae) && ae.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ae.RetryAfterSeconds()))
	} else if databaseRefused(err) {
		w.Header().Set("Retry-After", databaseRetryAfter)
	}
	cerr := toConnect(err)
	if connectErrors.IsSupported(r) {
		_ = connectErrors.Write(w, r, cerr)
		return
	}
	var ce *connect.Error
	errors.As(cerr, &ce)
	st := httpStatus(ce.Code())
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(st)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": st, "message": ce.Message()})
}

// refuse is a Connect error whose message the SDK's user reads: a whole
// sentence, as the console's other answers are (errors.New's strings are
// lower-case fragments by convention, meant to be wrapped).
func refuse(code connect.Code, message string) error {
	return connect.NewError(code, errors.New(message))
}
