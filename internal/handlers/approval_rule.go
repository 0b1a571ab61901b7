package handlers

import (
	"context"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/tenant"
)

// auditedApprovalRule is ApprovalRule for org t's queue, the agent change
// audited as agent.update (before and after, and the approval that made
// it) in the decision's transaction; nil while ApprovalRule is (the rule
// scope is refused).
func (s *Server) auditedApprovalRule(t *tenant.Tenant) func(ctx context.Context, tx *gorm.DB, actor *authz.Actor, a approvals.Approval) error {
	if s.ApprovalRule == nil {
		return nil
	}
	return func(ctx context.Context, tx *gorm.DB, actor *authz.Actor, a approvals.Approval) error {
		before, err := store.ByID[agents.Agent](ctx, tx, a.AgentID, "agent")
		if err != nil {
			return err
		}
		if err := s.ApprovalRule(ctx, tx, actor, a); err != nil {
			return err
		}
		after, err := store.ByID[agents.Agent](ctx, tx, a.AgentID, "agent")
		if err != nil {
			return err
		}
		_, err = t.Audit.AppendTx(ctx, tx, audit.Event{Actor: actor.AuditActor(), Action: "agent.update", Target: agentTarget(after), Decision: audit.Allow,
			Details: audit.Details(map[string]any{"before": toAgentJSON(before), "after": toAgentJSON(after), "approval_id": a.ID})})
		return err
	}
}
