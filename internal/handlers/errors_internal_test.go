package handlers

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
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
