package e2b

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// TestWriteErrorRetryAfter: a refusal saying when trying again may
// succeed (the gateway busy with other uploads) carries Retry-After in
// whole seconds, rounded up, on the REST /files routes; others carry none.
func TestWriteErrorRetryAfter(t *testing.T) {
	t.Parallel()
	busy := apperr.New(apperr.ErrUnavailable, "replica_busy", "The replica is busy.")
	busy.RetryAfter = 4200 * time.Millisecond
	for _, tc := range []struct {
		name, retryAfter string
		err              error
	}{
		{"busy", "5", fmt.Errorf("write: %w", busy)},
		{"broken", "", apperr.New(apperr.ErrUnavailable, "backend_error", "The backend failed.")},
		{"database refusing", "5", fmt.Errorf("look up the sandbox: %w", &pgconn.PgError{Code: "57P03"})},
	} {
		rec := httptest.NewRecorder()
		writeError(rec, httptest.NewRequest(http.MethodPost, "/files?path=a.txt", nil), tc.err)
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != tc.retryAfter {
			t.Errorf("%s: answered %d with Retry-After %q, want 503 with %q", tc.name, rec.Code, rec.Header().Get("Retry-After"), tc.retryAfter)
		}
	}
}
