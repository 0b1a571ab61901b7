package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/orgs"
)

// TestErrorRetryAfter: an error saying when trying again may succeed (a
// replica busy with uploads) answers with Retry-After in whole seconds,
// rounded up; one that says nothing of it answers without.
func TestErrorRetryAfter(t *testing.T) {
	s := &Server{Deps: Deps{Logger: slog.New(slog.DiscardHandler)}}
	busy := apperr.New(apperr.ErrUnavailable, "replica_busy", "The replica is busy.")
	busy.RetryAfter = 1500 * time.Millisecond
	for _, tc := range []struct {
		name, code, retryAfter string
		err                    error
	}{
		{"busy", "replica_busy", "2", fmt.Errorf("write: %w", busy)},
		{"broken", "backend_error", "", apperr.New(apperr.ErrUnavailable, "backend_error", "The backend failed.")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			c := echo.New().NewContext(httptest.NewRequest(http.MethodPut, "/api/v1/orgs/acme/sessions/1/files", nil), rec)
			s.handleError(tc.err, c)
			var body errorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if rec.Code != http.StatusServiceUnavailable || body.Error.Code != tc.code {
				t.Fatalf("answered %d %q, want 503 %q", rec.Code, body.Error.Code, tc.code)
			}
			if got := rec.Header().Get("Retry-After"); got != tc.retryAfter {
				t.Fatalf("Retry-After %q, want %q", got, tc.retryAfter)
			}
		})
	}
}

// TestErrorLogLevels: a caller that hung up is answered 499 with no error
// logged, a busy refusal is a warning, and a real failure is an error.
func TestErrorLogLevels(t *testing.T) {
	busy := apperr.New(apperr.ErrUnavailable, "replica_busy", "The replica is busy.")
	busy.RetryAfter = time.Second
	for _, tc := range []struct {
		name   string
		err    error
		gone   bool
		status int
		level  string // the level logged, "" for nothing above debug
	}{
		{"caller left", fmt.Errorf("wait for a write slot: %w", context.Canceled), true, statusCallerLeft, ""},
		{"cancelled with the caller still there", fmt.Errorf("inner: %w", context.Canceled), false, http.StatusInternalServerError, "ERROR"},
		{"busy", busy, false, http.StatusServiceUnavailable, "WARN"},
		{"failure", errors.New("disk on fire"), false, http.StatusInternalServerError, "ERROR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs strings.Builder
			s := &Server{Deps: Deps{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}}
			req := httptest.NewRequest(http.MethodPut, "/api/v1/orgs/acme/sessions/1/files", nil)
			if tc.gone {
				ctx, cancel := context.WithCancel(req.Context())
				cancel()
				req = req.WithContext(ctx)
			}
			rec := httptest.NewRecorder()
			s.handleError(tc.err, echo.New().NewContext(req, rec))
			if rec.Code != tc.status {
				t.Fatalf("answered %d, want %d", rec.Code, tc.status)
			}
			got := ""
			for _, l := range []string{"ERROR", "WARN"} {
				if strings.Contains(logs.String(), "level="+l) {
					got = l
				}
			}
			if got != tc.level {
				t.Fatalf("logged %q at level %q, want %q", logs.String(), got, tc.level)
			}
		})
	}
}

// TestOutageAnswerShapes: a database outage answers 503 with Retry-After
// in the shape of the surface: the envelope with database_unavailable on
// the API, E2B's {"code","message"} on the E2B endpoint.
func TestOutageAnswerShapes(t *testing.T) {
	s := &Server{Deps: Deps{Logger: slog.New(slog.DiscardHandler)}}
	outage := &orgs.UnavailableError{Database: "catalog", Err: &pgconn.PgError{Code: "57P03"}}
	for _, tc := range []struct{ path, want string }{
		{"/api/v1/orgs", `"code":"database_unavailable"`},
		{"/e2b/orgs/acme/sandboxes", `"code":503`},
	} {
		rec := httptest.NewRecorder()
		c := echo.New().NewContext(httptest.NewRequest(http.MethodGet, tc.path, nil), rec)
		s.handleError(outage, c)
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("%s: answered %d Retry-After %q %s, want 503 with Retry-After and %s", tc.path, rec.Code, rec.Header().Get("Retry-After"), rec.Body, tc.want)
		}
	}
}
