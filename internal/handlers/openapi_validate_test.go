package handlers_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/gatehouse/gatehouse/internal/apidoc"
	"github.com/gatehouse/gatehouse/internal/e2b"
)

// contractDoc is the parsed document and its router, built once per test
// binary: parsing it for each of hundreds of test consoles would be waste.
type contractDoc struct {
	doc    *openapi3.T
	router routers.Router
}

var (
	contractOnce sync.Once
	contract     contractDoc
	contractErr  error
)

func loadContract() (contractDoc, error) {
	contractOnce.Do(func() {
		doc, err := apidoc.Load(context.Background())
		if err != nil {
			contractErr = err
			return
		}
		r, err := gorillamux.NewRouter(doc)
		if err != nil {
			contractErr = fmt.Errorf("openapi router: %w", err)
			return
		}
		// Export bodies are text; validate them as strings.
		openapi3filter.RegisterBodyDecoder("application/x-ndjson", openapi3filter.PlainBodyDecoder)
		openapi3filter.RegisterBodyDecoder("text/csv", openapi3filter.PlainBodyDecoder)
		openapi3filter.RegisterBodyDecoder("application/x-asciicast", openapi3filter.PlainBodyDecoder)
		// A page's error is an HTML page unless the client asked for JSON.
		openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
		contract = contractDoc{doc: doc, router: r}
	})
	return contract, contractErr
}

// validateAPI wraps the console so that every documented exchange (the JSON
// API, /healthz and /readyz) a handler test
// makes is checked against the OpenAPI document: a request the document
// rejects must be refused by the server (4xx), and every response must be
// one the document describes. Mismatches fail the test at cleanup, with the
// method, path and what differs.
func validateAPI(t *testing.T, h http.Handler) http.Handler {
	t.Helper()
	c, err := loadContract()
	if err != nil {
		t.Fatal(err)
	}
	v := &apiValidator{t: t, c: c, next: h}
	t.Cleanup(v.report)
	return v
}

type apiValidator struct {
	t    *testing.T
	c    contractDoc
	next http.Handler

	mu         sync.Mutex
	mismatches []string
}

// report fails the test for each mismatch. GATEHOUSE_OPENAPI_REPORT_ONLY=1
// only logs them: for surveying what a large change to the API breaks in
// the document before fixing it.
func (v *apiValidator) report() {
	v.mu.Lock()
	defer v.mu.Unlock()
	fail := v.t.Errorf
	if os.Getenv("GATEHOUSE_OPENAPI_REPORT_ONLY") == "1" {
		fail = v.t.Logf
	}
	for _, m := range v.mismatches {
		fail("OpenAPI mismatch: %s", m)
	}
}

func (v *apiValidator) fail(format string, args ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.mismatches = append(v.mismatches, fmt.Sprintf(format, args...))
}

func (v *apiValidator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if isUpgrade(r) || e2b.SandboxID(r) != "" {
		// A request naming a sandbox is the E2B data plane's (envd's
		// API, served before the console's router), not the console's.
		v.next.ServeHTTP(w, r)
		return
	}
	route, params, err := v.c.router.FindRoute(r)
	if err != nil {
		// Not a documented route: pages, unknown paths (404) and wrong
		// methods (405); TestOpenAPICoversRoutes checks the route table
		// against the document.
		v.next.ServeHTTP(w, r)
		return
	}
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	check := r.Clone(r.Context())
	check.Body = io.NopCloser(bytes.NewReader(body))
	in := &openapi3filter.RequestValidationInput{Request: check, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}}
	reqErr := openapi3filter.ValidateRequest(r.Context(), in)

	rec := &teeWriter{ResponseWriter: w, status: http.StatusOK}
	v.next.ServeHTTP(rec, r)

	what := r.Method + " " + r.URL.Path
	if reqErr != nil && rec.status < 400 {
		v.fail("%s: the server accepted (%d) a request the document rejects: %v", what, rec.status, reqErr)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: rec.status, Header: rec.Header(),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
	out.SetBodyBytes(rec.body.Bytes())
	if err := openapi3filter.ValidateResponse(r.Context(), out); err != nil {
		v.fail("%s: response %d does not match the document: %v (body %.300s)", what, rec.status, err, rec.body.String())
	}
}

func isUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// teeWriter passes the response through and keeps a copy to validate.
type teeWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
	body   bytes.Buffer
}

func (w *teeWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *teeWriter) Write(b []byte) (int, error) {
	w.wrote = true
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}

func (w *teeWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *teeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := w.ResponseWriter.(http.Hijacker); ok {
		return h.Hijack()
	}
	return nil, nil, errors.New("hijack not supported")
}

func (w *teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
