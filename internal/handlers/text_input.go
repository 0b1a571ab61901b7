package handlers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
)

// maxJSONDepth bounds nesting in request bodies: no request shape is
// deeper than a few levels, and a deep one costs the decoder for nothing.
const maxJSONDepth = 32

// textProblem is one text input the edge refuses.
type textProblem struct {
	field, reason string
}

func (p *textProblem) err() error {
	return &apperr.ValidationError{Fields: map[string]string{p.field: p.reason}}
}

// badText says what is wrong with s as text, or "". Postgres cannot store
// or compare NUL or invalid UTF-8 (SQLite can), so they are refused here,
// once for every route and both databases, rather than failing deep in a
// query.
func badText(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "This value is not valid UTF-8 text."
	case strings.IndexByte(s, 0) >= 0:
		return "This value holds a NUL character, which is not allowed."
	}
	return ""
}

// pathParamsProblem checks the path parameters. It runs before anything
// reads them (an org slug is looked up before authentication).
func pathParamsProblem(c echo.Context) *textProblem {
	for _, name := range c.ParamNames() {
		if why := badText(c.Param(name)); why != "" {
			return &textProblem{field: name, reason: why}
		}
	}
	return nil
}

// inputProblem checks the query string, form fields and JSON body. A JSON
// body is read, checked and put back for the handler; one that does not
// parse is left to decodeJSON, which explains what is wrong.
func inputProblem(c echo.Context) (*textProblem, error) {
	r := c.Request()
	for k, vs := range c.QueryParams() {
		if why := badText(k); why != "" {
			return &textProblem{field: "query", reason: "A query parameter name is not valid text."}, nil
		}
		for _, v := range vs {
			if why := badText(v); why != "" {
				return &textProblem{field: k, reason: why}, nil
			}
		}
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if isForm(r) {
		params, err := c.FormParams()
		if err != nil {
			return nil, nil // the handler reports the unreadable form
		}
		for k, vs := range params {
			if why := badText(k); why != "" {
				return &textProblem{field: "form", reason: "A form field name is not valid text."}, nil
			}
			for _, v := range vs {
				if why := badText(v); why != "" {
					return &textProblem{field: k, reason: why}, nil
				}
			}
		}
		return nil, nil
	}
	if ct := r.Header.Get(echo.HeaderContentType); ct != "" && !strings.HasPrefix(ct, echo.MIMEApplicationJSON) {
		return nil, nil
	}
	body, err := io.ReadAll(r.Body)
	// The handler reads the same bytes, and the same error if the read
	// failed (an oversize body).
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
	if err != nil {
		return nil, nil
	}
	return jsonTextProblem(body), nil
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err == nil {
		return 0, io.EOF
	}
	return 0, e.err
}

// jsonTextProblem walks a JSON document and reports the first key or
// string value that is not valid text, or nesting beyond maxJSONDepth,
// naming its field ("roles[1].domain"). Invalid UTF-8 is looked for in the
// raw bytes: the decoder would silently turn it into U+FFFD.
func jsonTextProblem(body []byte) *textProblem {
	// Every problem the walk reports needs invalid UTF-8, a NUL (raw or
	// escaped) or more brackets than maxJSONDepth. Most bodies, the
	// gateway's included, have none and skip the walk.
	if utf8.Valid(body) && bytes.IndexByte(body, 0) < 0 && !bytes.Contains(body, []byte(`\u0000`)) &&
		bytes.Count(body, []byte("{"))+bytes.Count(body, []byte("[")) <= maxJSONDepth {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	type frame struct {
		array   bool
		haveKey bool // an object member's name was read, its value not yet
		key     string
		index   int
	}
	var stack []frame
	path := func(last string) string {
		var b strings.Builder
		for _, f := range stack {
			switch {
			case f.array:
				fmt.Fprintf(&b, "[%d]", f.index)
			case f.haveKey:
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(f.key)
			}
		}
		if last != "" {
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(last)
		}
		if b.Len() == 0 {
			return "body"
		}
		return b.String()
	}
	expectKey := func() bool { return len(stack) > 0 && !stack[len(stack)-1].array && !stack[len(stack)-1].haveKey }
	// afterValue moves the enclosing container past a finished value.
	afterValue := func() {
		if len(stack) == 0 {
			return
		}
		top := &stack[len(stack)-1]
		if top.array {
			top.index++
		} else {
			top.haveKey, top.key = false, ""
		}
	}
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return nil // not JSON: decodeJSON explains it
		}
		raw := body[start:dec.InputOffset()]
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if len(stack) >= maxJSONDepth {
					return &textProblem{field: path(""), reason: fmt.Sprintf("The JSON is nested more than %d levels deep.", maxJSONDepth)}
				}
				stack = append(stack, frame{array: v == '['})
			case '}', ']':
				stack = stack[:len(stack)-1]
				afterValue()
			}
		case string:
			isKey := expectKey()
			why := badText(v)
			if why == "" && !utf8.Valid(raw) {
				why = "This value is not valid UTF-8 text."
			}
			if isKey {
				if why != "" {
					return &textProblem{field: path(strconv.Quote(v)), reason: "This field name is not valid text."}
				}
				stack[len(stack)-1].haveKey, stack[len(stack)-1].key = true, v
				continue
			}
			if why != "" {
				return &textProblem{field: path(""), reason: why}
			}
			afterValue()
		default:
			afterValue()
		}
	}
}

// textChecked refuses a request whose query, form or JSON body holds text
// Postgres cannot take, after the route's authorization ran (so a request
// that would have been refused is refused, and audited, as such) and
// before the handler. The refusal is itself audited as a denial, in the
// org's log on the org surface and the platform's otherwise, so that a
// sign-in with such an e-mail still leaves a record.
func (s *Server) textChecked(sf surface, next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		p, err := inputProblem(c)
		if err != nil {
			return err
		}
		if p == nil {
			return next(c)
		}
		if err := s.recordRejection(c, sf, p); err != nil {
			return err
		}
		return p.err()
	}
}

// recordRejection audits an input refused at the edge.
func (s *Server) recordRejection(c echo.Context, sf surface, p *textProblem) error {
	actor := principalOf(c).AuditActor()
	target := audit.Target{Type: "route", Name: c.Request().Method + " " + c.Path()}
	details := map[string]string{"field": p.field, "reason": p.reason}
	if t := tenantOf(c); (sf == orgSurface || sf == e2bSurface) && t != nil {
		return s.appendOrg(c, t, actor, "request.rejected", target, audit.Deny, details)
	}
	return s.platformEvent(c, actor, "request.rejected", target, audit.Deny, details)
}
