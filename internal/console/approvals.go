package console

import (
	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/gateway"
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
