package agentd

import (
	"net/http"
	"time"
)

// handleHealth answers GET /healthz without authentication.
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) error {
	s.mu.Lock()
	active := s.running
	s.mu.Unlock()
	execState, execWhy := s.ExecReporting()
	egress, egressWhy := s.egress.enforcement()
	writeJSON(w, http.StatusOK, Health{
		ExecReporting:       execState,
		ExecReportingReason: execWhy,
		Status:              "ok",
		Version:             Version,
		ActiveSessions:      active,
		UptimeSeconds:       time.Since(s.started).Seconds(),

		ProcessTracking: s.tracker.mode(),

		EgressEnforcement:       egress,
		EgressEnforcementReason: egressWhy,
	})
	return nil
}
