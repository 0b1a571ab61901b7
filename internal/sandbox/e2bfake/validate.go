package e2bfake

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// maxRequestBody bounds a request body the fake reads.
const maxRequestBody = 1 << 20

// statusError is a request the API refuses, with the status and message
// to answer.
type statusError struct {
	status int
	msg    string
}

func (e statusError) Error() string { return e.msg }

// badf is a 400, the answer of E2B's spec validation and of its handlers'
// own checks.
func badf(format string, args ...any) error {
	return statusError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// decodeBody reads a JSON request body into v the way E2B's OpenAPI
// validation sees it: a body must be declared application/json, a required
// body must be present, and it must be one JSON object of the declared
// types (json.Unmarshal's type errors stand for the schema's).
func decodeBody(r *http.Request, v any, required bool) error {
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBody+1))
	if err != nil {
		return badf("Error reading the request body: %v", err)
	}
	if len(raw) > maxRequestBody {
		return badf("Request body is too large.")
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		if required {
			return badf("request body has an error: value is required but missing")
		}
		return nil
	}
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		return badf("header Content-Type has unexpected value %q", ct)
	}
	if !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")) {
		return badf("request body has an error: value must be an object")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(v); err != nil {
		return badf("request body has an error: %v", err)
	}
	if dec.More() {
		return badf("request body has an error: unexpected data after the JSON object")
	}
	return nil
}

// parseMetadataFilter decodes the metadata list filter exactly as E2B does
// (packages/api/internal/utils: parseFilters): the value the router already
// unescaped once is unescaped again as a whole, split on & and =, and each
// key and value unescaped once more. A client that encodes one layer too
// few breaks on values holding & or =; one that encodes with + for spaces
// or leaves % bare gets an error or a different value.
func parseMetadataFilter(raw string) (map[string]string, error) {
	if raw == "" {
		return nil, nil
	}
	q, err := url.QueryUnescape(raw)
	if err != nil {
		return nil, badf("Error parsing metadata: error when unescaping query: %v", err)
	}
	out := map[string]string{}
	for _, pair := range strings.Split(q, "&") {
		parts := strings.Split(pair, "=")
		if len(parts) != 2 {
			return nil, badf("Error parsing metadata: invalid key value pair in query")
		}
		k, err := url.QueryUnescape(parts[0])
		if err != nil {
			return nil, badf("Error parsing metadata: error when unescaping key: %v", err)
		}
		v, err := url.QueryUnescape(parts[1])
		if err != nil {
			return nil, badf("Error parsing metadata: error when unescaping value: %v", err)
		}
		out[k] = v
	}
	return out, nil
}

// parseDateTime checks an OpenAPI date-time (RFC 3339) query value.
func parseDateTime(name, v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, badf("parameter %q in query has an error: value %q is not a valid date-time (RFC 3339)", name, v)
	}
	return t, nil
}

// writeBad answers a statusError with its status and anything else with
// 500.
func writeBad(w http.ResponseWriter, err error) {
	var se statusError
	if errors.As(err, &se) {
		writeError(w, se.status, se.msg)
		return
	}
	writeError(w, http.StatusInternalServerError, err.Error())
}
