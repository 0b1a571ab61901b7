package agentd

import (
	"errors"
	"fmt"
	"net/http"
)

// Error codes carried in {"error":{"code"}}. Each maps to one HTTP status.
const (
	CodeBadRequest          = "bad_request"          // 400: a field is missing or invalid
	CodeMalformedJSON       = "malformed_json"       // 400: body is not the expected JSON object
	CodeUnauthorized        = "unauthorized"         // 401: missing or wrong bearer token
	CodePathOutsideRoot     = "path_outside_root"    // 403: the path escapes the configured root
	CodeNotFound            = "not_found"            // 404: no such session, file or route
	CodeMethodNotAllowed    = "method_not_allowed"   // 405
	CodeNotRunning          = "not_running"          // 409: the session has ended
	CodeStdinClosed         = "stdin_closed"         // 409: stdin was not requested or was closed
	CodeNotATTY             = "not_a_tty"            // 409: resize on a non-TTY session
	CodeIsDirectory         = "is_directory"         // 409: a file operation hit a directory
	CodeIDInUse             = "id_in_use"            // 409: a session with the requested id exists
	CodeKilledFirst         = "killed_first"         // 409: a kill named the requested id before its create arrived
	CodeAlreadyRekeyed      = "already_rekeyed"      // 409: POST /v1/token was already accepted once
	CodeEgressUnenforceable = "egress_unenforceable" // 409: a network policy requires enforcement this agentd cannot give
	CodeNoNetworkPolicy     = "no_network_policy"    // 409: a policy update for a session created without one
	CodeUsedBeforeRekey     = "used_before_rekey"    // 409: POST /v1/token after another request took the template's token
	CodeChecksumMismatch    = "checksum_mismatch"    // 422: a download's SHA-256 differs from the pin
	CodeTooLarge            = "too_large"            // 413: body or download over its limit
	CodeTooManySessions     = "too_many_sessions"    // 429: concurrent session cap reached
	CodeTTYUnsupported      = "tty_unsupported"      // 501: this platform has no PTY support
	CodeFetchFailed         = "fetch_failed"         // 502: the download source failed
	CodeShuttingDown        = "shutting_down"        // 503: the server is closing
	CodeTimeout             = "timeout"              // 504: an operation (stdin write, fetch) timed out
	CodeInternal            = "internal"             // 500: anything else

	// CodeAnswerTooLarge is the Client's own: agentd never sends it. The
	// Client reports it (as a 502) when an answer is larger than any
	// answer agentd gives, rather than reading on (see answer.go).
	CodeAnswerTooLarge = "answer_too_large" // 502: agentd's answer is over the client's cap
)

// Sentinel errors, one per code, for errors.Is on errors returned by Client.
var (
	ErrBadRequest          = errors.New("agentd: bad request")
	ErrUnauthorized        = errors.New("agentd: unauthorized")
	ErrPathOutsideRoot     = errors.New("agentd: path outside root")
	ErrNotFound            = errors.New("agentd: not found")
	ErrMethodNotAllowed    = errors.New("agentd: method not allowed")
	ErrNotRunning          = errors.New("agentd: session not running")
	ErrStdinClosed         = errors.New("agentd: stdin closed")
	ErrNotATTY             = errors.New("agentd: session has no tty")
	ErrIsDirectory         = errors.New("agentd: is a directory")
	ErrIDInUse             = errors.New("agentd: session id in use")
	ErrKilledFirst         = errors.New("agentd: session killed before it started")
	ErrAlreadyRekeyed      = errors.New("agentd: already rekeyed")
	ErrUsedBeforeRekey     = errors.New("agentd: used before rekey")
	ErrEgressUnenforceable = errors.New("agentd: network policy cannot be enforced")
	ErrNoNetworkPolicy     = errors.New("agentd: session has no network policy")
	ErrChecksumMismatch    = errors.New("agentd: checksum mismatch")
	ErrTooLarge            = errors.New("agentd: too large")
	ErrTooManySessions     = errors.New("agentd: too many sessions")
	ErrTTYUnsupported      = errors.New("agentd: tty unsupported")
	ErrFetchFailed         = errors.New("agentd: fetch failed")
	ErrShuttingDown        = errors.New("agentd: shutting down")
	ErrTimeout             = errors.New("agentd: timeout")
	ErrInternal            = errors.New("agentd: internal error")
	ErrAnswerTooLarge      = errors.New("agentd: answer too large")
)

// codeInfo maps a code to its status and sentinel. It is a function rather
// than a package map so there is no package-level mutable state.
func codeInfo(code string) (int, error) {
	switch code {
	case CodeBadRequest:
		return http.StatusBadRequest, ErrBadRequest
	case CodeMalformedJSON:
		return http.StatusBadRequest, ErrBadRequest
	case CodeUnauthorized:
		return http.StatusUnauthorized, ErrUnauthorized
	case CodePathOutsideRoot:
		return http.StatusForbidden, ErrPathOutsideRoot
	case CodeNotFound:
		return http.StatusNotFound, ErrNotFound
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed, ErrMethodNotAllowed
	case CodeNotRunning:
		return http.StatusConflict, ErrNotRunning
	case CodeStdinClosed:
		return http.StatusConflict, ErrStdinClosed
	case CodeNotATTY:
		return http.StatusConflict, ErrNotATTY
	case CodeIsDirectory:
		return http.StatusConflict, ErrIsDirectory
	case CodeIDInUse:
		return http.StatusConflict, ErrIDInUse
	case CodeKilledFirst:
		return http.StatusConflict, ErrKilledFirst
	case CodeAlreadyRekeyed:
		return http.StatusConflict, ErrAlreadyRekeyed
	case CodeUsedBeforeRekey:
		return http.StatusConflict, ErrUsedBeforeRekey
	case CodeEgressUnenforceable:
		return http.StatusConflict, ErrEgressUnenforceable
	case CodeNoNetworkPolicy:
		return http.StatusConflict, ErrNoNetworkPolicy
	case CodeChecksumMismatch:
		return http.StatusUnprocessableEntity, ErrChecksumMismatch
	case CodeTooLarge:
		return http.StatusRequestEntityTooLarge, ErrTooLarge
	case CodeTooManySessions:
		return http.StatusTooManyRequests, ErrTooManySessions
	case CodeTTYUnsupported:
		return http.StatusNotImplemented, ErrTTYUnsupported
	case CodeFetchFailed:
		return http.StatusBadGateway, ErrFetchFailed
	case CodeShuttingDown:
		return http.StatusServiceUnavailable, ErrShuttingDown
	case CodeTimeout:
		return http.StatusGatewayTimeout, ErrTimeout
	case CodeAnswerTooLarge:
		return http.StatusBadGateway, ErrAnswerTooLarge
	default:
		return http.StatusInternalServerError, ErrInternal
	}
}

// Error is an agentd protocol error. The server returns it from handlers to
// choose the response; the client returns it for every error response, so
// callers can use errors.Is(err, ErrNotFound) or errors.As(err, &*Error).
type Error struct {
	Status  int    // HTTP status
	Code    string // one of the Code constants
	Message string // a full sentence meant for people
	// Foreign marks an answer that was not agentd's error envelope: a
	// proxy, load balancer or other server in front of it. Its 404 is not
	// "no such session" and its 5xx says nothing of agentd.
	Foreign bool
}

// Unknown reports agentd's own word that it has no such session (or
// file): not a 404 of something in front of it.
func (e *Error) Unknown() bool { return e.Code == CodeNotFound && !e.Foreign }

func (e *Error) Error() string {
	return fmt.Sprintf("agentd: %s (%d): %s", e.Code, e.Status, e.Message)
}

// Unwrap returns the sentinel error of the code.
func (e *Error) Unwrap() error {
	_, sentinel := codeInfo(e.Code)
	return sentinel
}

// StatusOf is the HTTP status agentd answers code with (500 for a code it
// does not know).
func StatusOf(code string) int {
	status, _ := codeInfo(code)
	return status
}

// newError builds an Error whose status follows from its code.
func newError(code, format string, args ...any) *Error {
	status, _ := codeInfo(code)
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// Unanswered reports a failure that says nothing of the request: no
// answer, a 5xx, or an answer of something in front of agentd.
func Unanswered(err error) bool {
	var ae *Error
	return !errors.As(err, &ae) || ae.Status >= 500 || ae.Foreign
}
