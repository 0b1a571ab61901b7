package console

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/clip"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/policy"
	"github.com/gatehouse/gatehouse/internal/store"
)

// gatewayApprovals is org's approval queue as the gateway's Asker uses it:
// the queue ApprovalQueue builds for the org's tenant (the process's
// notifier, the org's webhook), from what the gateway holds of the org.
func (c *Console) gatewayApprovals(org gateway.Org) gateway.ApprovalQueue {
	svc := &approvals.Service{DB: org.DB, Audit: org.Audit, Org: org.Slug, Notifier: c.Approvals}
	if c.ApprovalWebhook != nil {
		svc.Requested = c.ApprovalWebhook.Hook(svc)
	}
	return svc
}

// askOverApprovals makes every org's gateway hold the execs its agents'
// rules ask about in that org's approval queue.
func (c *Console) askOverApprovals() {
	c.Gateway.Asker = &gateway.Approvals{Gateway: c.Gateway, Queue: c.gatewayApprovals}
}

// approvalRule is the "rule" scope of an approval: the allow rule for the
// program and arguments that asked (agents.AllowRuleFor) appended to the
// agent's execution policy in the decision's transaction (the handlers
// audit it as agent.update).
func approvalRule(ctx context.Context, tx *gorm.DB, actor *authz.Actor, a approvals.Approval) error {
	ag, err := store.ByID[agents.Agent](ctx, tx, a.AgentID, "agent")
	if err != nil {
		return err
	}
	rule, err := agents.AllowRuleFor(ag, a.Command, clip.String(fmt.Sprintf("approved by %s (approval %d)", actor.Name, a.ID), policy.MaxReason))
	if err != nil {
		return err
	}
	_, _, err = agents.AddExecRule(ctx, tx, a.AgentID, rule, time.Now())
	return err
}
