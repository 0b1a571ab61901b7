package gateway

import (
	"context"
	"time"

	"github.com/gatehouse/gatehouse/internal/recordings"
)

// EndReason says what ended a command beyond its state: "session_close"
// when its session's close did (the close records why before it kills
// anything, so the reason is there by the time agentd reports the end).
// A failed read says nothing more rather than fail the caller.
func (g *Gateway) EndReason(ctx context.Context, org Org, sessionID, commandID int64) string {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	c, err := recordings.GetInSession(rctx, org.DB, sessionID, commandID)
	if err == nil && recordings.EndedBySessionClose(c.Reason) {
		return "session_close"
	}
	return ""
}
