package e2b

import (
	"context"

	"github.com/gatehouse/gatehouse/internal/gateway"
)

// startHeld starts ex as Start does, holding the stream while the agent's
// execution rules hold the command for a person: the exec is sent again
// with the pending approval's id, each time waiting up to pollWait for
// the decision, until it is decided. Approved, it runs (once, through the
// gateway's audited exec path) and the stream goes on as any Start's;
// denied, expired or cancelled, Start ends with PermissionDenied and the
// gateway's message (approval_denied, approval_expired,
// approval_cancelled). Nothing is sent on the stream while it waits: an
// SDK reads the start event first, so no keepalive can come before it.
func (s *Server) startHeld(ctx context.Context, c call, ex gateway.ExecRequest) (gateway.Output, error) {
	out, err := s.Gateway.Exec(ctx, c.Org, c.Actor, c.meta, c.SessionID, ex)
	for err == nil && out.Approval != nil {
		ex.ApprovalID, ex.WaitMS = out.Approval.ID, pollWait.Milliseconds()
		out, err = s.Gateway.Exec(ctx, c.Org, c.Actor, c.meta, c.SessionID, ex)
	}
	return out, err
}
