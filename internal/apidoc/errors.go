package apidoc

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
)

// The error codes each operation answers are written once, in openapi.yaml:
// the document's root holds named sets (x-error-sets, each a list of
// "<status> <code>"), and each operation lists in x-errors the sets and
// single "<status> <code>" entries it answers. expandErrors turns them into
// what a client reads: one response per status whose envelope's code is an
// enum of exactly those codes. The handler tests validate every answer they
// get against it, so an operation answering a code it does not list fails
// them.
const (
	extSets   = "x-error-sets"
	extErrors = "x-errors"
)

// expandErrors replaces each operation's x-errors and its blanket 4XX
// answer with one answer per listed status. It refuses an operation without
// x-errors, an unknown set, and a status outside 400-499 (server errors
// stay the 5XX answer: the database or a system behind the console, on any
// operation).
func expandErrors(doc *openapi3.T) error {
	sets, err := errorSets(doc.Extensions[extSets])
	if err != nil {
		return err
	}
	delete(doc.Extensions, extSets)
	envelope := doc.Components.Schemas["Error"]
	if envelope == nil || envelope.Value == nil {
		return fmt.Errorf("apidoc: components.schemas.Error is missing")
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			where := method + " " + path
			raw, ok := op.Extensions[extErrors]
			if !ok {
				return fmt.Errorf("apidoc: %s (%s) lists no x-errors", where, op.OperationID)
			}
			delete(op.Extensions, extErrors)
			codes, err := operationCodes(raw, sets)
			if err != nil {
				return fmt.Errorf("apidoc: %s (%s): %w", where, op.OperationID, err)
			}
			page := !strings.HasPrefix(path, "/api/") && !strings.HasPrefix(path, "/downloads/") && path != "/healthz" && path != "/readyz"
			op.Responses.Delete("4XX")
			for _, status := range slices.Sorted(maps.Keys(codes)) {
				op.Responses.Set(strconv.Itoa(status), &openapi3.ResponseRef{Value: errorResponse(envelope.Value, codes[status], page)})
			}
			if page {
				op.Responses.Set("5XX", &openapi3.ResponseRef{Value: errorResponse(envelope.Value, nil, true)})
			}
		}
	}
	return nil
}

// errorSets reads x-error-sets: set name to status to codes.
func errorSets(raw any) (map[string]map[int][]string, error) {
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("apidoc: %s is missing or not a map", extSets)
	}
	out := make(map[string]map[int][]string, len(m))
	for name, v := range m {
		list, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("apidoc: %s.%s is not a list", extSets, name)
		}
		codes := map[int][]string{}
		for _, e := range list {
			s, _ := e.(string)
			status, code, err := parseEntry(s)
			if err != nil {
				return nil, fmt.Errorf("apidoc: %s.%s: %w", extSets, name, err)
			}
			codes[status] = append(codes[status], code)
		}
		out[name] = codes
	}
	return out, nil
}

// operationCodes resolves an operation's x-errors into status to sorted,
// distinct codes.
func operationCodes(raw any, sets map[string]map[int][]string) (map[int][]string, error) {
	list, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("%s is not a list", extErrors)
	}
	out := map[int][]string{}
	for _, e := range list {
		s, _ := e.(string)
		if set, ok := sets[s]; ok {
			for status, codes := range set {
				out[status] = append(out[status], codes...)
			}
			continue
		}
		status, code, err := parseEntry(s)
		if err != nil {
			return nil, fmt.Errorf("%q is neither a set in %s nor \"<status> <code>\"", s, extSets)
		}
		out[status] = append(out[status], code)
	}
	for status, codes := range out {
		slices.Sort(codes)
		out[status] = slices.Compact(codes)
	}
	return out, nil
}

func parseEntry(s string) (int, string, error) {
	st, code, ok := strings.Cut(s, " ")
	status, err := strconv.Atoi(st)
	if !ok || err != nil || status < 400 || status > 499 || code == "" || strings.ContainsAny(code, " \t") {
		return 0, "", fmt.Errorf("%q is not \"<4xx status> <code>\"", s)
	}
	return status, code, nil
}

// errorResponse is the envelope answered with one of codes (any code when
// codes is nil); a page's answer may also be an HTML page.
func errorResponse(envelope *openapi3.Schema, codes []string, page bool) *openapi3.Response {
	schema := envelope
	desc := "An error, as the envelope."
	if codes != nil {
		inner := *envelope.Properties["error"].Value
		inner.Properties = maps.Clone(inner.Properties)
		code := *inner.Properties["code"].Value
		code.Enum = make([]any, len(codes))
		for i, c := range codes {
			code.Enum[i] = c
		}
		code.Description = "One of the codes this operation answers with this status."
		inner.Properties["code"] = &openapi3.SchemaRef{Value: &code}
		outer := *envelope
		outer.Properties = openapi3.Schemas{"error": &openapi3.SchemaRef{Value: &inner}}
		schema = &outer
		desc = "An error: `" + strings.Join(codes, "`, `") + "`."
	}
	content := openapi3.NewContentWithJSONSchema(schema)
	if page {
		desc += " JSON when the request's Accept names application/json (and not text/html); otherwise an HTML page."
		content["text/html"] = openapi3.NewMediaType().WithSchema(openapi3.NewStringSchema())
	}
	return openapi3.NewResponse().WithDescription(desc).WithContent(content)
}

// Codes lists, per status, the error codes the operation answers, as the
// expanded document says.
func Codes(op *openapi3.Operation) map[int][]string {
	out := map[int][]string{}
	for key, ref := range op.Responses.Map() {
		status, err := strconv.Atoi(key)
		if err != nil || status < 400 || status > 499 || ref.Value == nil {
			continue
		}
		mt := ref.Value.Content.Get("application/json")
		if mt == nil || mt.Schema == nil || mt.Schema.Value == nil {
			continue
		}
		inner := mt.Schema.Value.Properties["error"]
		if inner == nil || inner.Value == nil || inner.Value.Properties["code"] == nil {
			continue
		}
		for _, c := range inner.Value.Properties["code"].Value.Enum {
			if s, ok := c.(string); ok {
				out[status] = append(out[status], s)
			}
		}
	}
	return out
}
