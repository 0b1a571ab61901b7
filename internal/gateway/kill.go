package gateway

import (
	"context"

	"github.com/gatehouse/gatehouse/internal/authz"
)

// Kill ends a command and everything it started, audited; the follower
// records its end.
func (g *Gateway) Kill(ctx context.Context, org Org, a *authz.Actor, m Meta, sessionID, commandID int64) (Output, error) {
	t, c, err := g.running(ctx, org, a, sessionID, commandID, ActKill)
	if err != nil {
		return Output{}, err
	}
	if _, err := org.Audit.Append(ctx, event(a, m, "command.kill", c.Target(), map[string]any{"session_id": sessionID})); err != nil {
		return Output{}, durable(err)
	}
	fctx, cancel := context.WithTimeout(ctx, g.callTimeout())
	defer cancel()
	resp, err := g.client(t).Kill(fctx, c.AgentdID)
	if err != nil {
		return Output{}, g.commandUpstream(ctx, org, t, c, err)
	}
	g.Followers.Follow(org.Slug, c.ID)
	return toOutput(c, resp), nil
}
