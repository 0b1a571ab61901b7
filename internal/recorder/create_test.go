package recorder_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/recorder"
)

// TestSortCreate: agentd's answer to a create sorts into one outcome,
// the same for the gateway's exec and a follower sending it again; an
// answer that was not agentd's is never a refusal.
func TestSortCreate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want recorder.CreateOutcome
	}{
		{"answered", nil, recorder.CreateStarted},
		{"arrived already", &agentd.Error{Status: 409, Code: agentd.CodeIDInUse}, recorder.CreateArrived},
		{"arrived, wrapped", fmt.Errorf("create: %w", &agentd.Error{Status: 409, Code: agentd.CodeIDInUse}), recorder.CreateArrived},
		{"refused", &agentd.Error{Status: 400, Code: "bad_request", Message: "no such cwd"}, recorder.CreateRefused},
		{"killed first", &agentd.Error{Status: 409, Code: agentd.CodeKilledFirst}, recorder.CreateRefused},
		{"agentd failed", &agentd.Error{Status: 503, Code: "unavailable"}, recorder.CreateUnanswered},
		{"a proxy's page", &agentd.Error{Status: 404, Code: "404", Foreign: true}, recorder.CreateUnanswered},
		{"a proxy's 409", &agentd.Error{Status: 409, Code: agentd.CodeIDInUse, Foreign: true}, recorder.CreateUnanswered},
		{"no answer", errors.New("connection refused"), recorder.CreateUnanswered},
	} {
		got, ae := recorder.SortCreate(tc.err)
		if got != tc.want {
			t.Errorf("%s: outcome %d, want %d", tc.name, got, tc.want)
		}
		if (got == recorder.CreateArrived || got == recorder.CreateRefused) && ae == nil {
			t.Errorf("%s: no agentd error given with the outcome", tc.name)
		}
	}
}
