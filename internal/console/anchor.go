package console

import (
	"context"

	"github.com/gatehouse/gatehouse/internal/anchor"
)

// newCheckpoints is the loop checkpointing every active org's audit chain
// head into the catalog; with several replicas one runs each round and
// every write is idempotent (see anchor.Service.Take).
func (c *Console) newCheckpoints() *anchor.Runner {
	return &anchor.Runner{
		Anchors:  c.Anchors,
		ListOrgs: c.activeOrgs,
		OpenOrg: func(ctx context.Context, slug string) (anchor.OrgDeps, error) {
			t, err := c.Tenants.Open(ctx, slug)
			if err != nil {
				return anchor.OrgDeps{}, err
			}
			return anchor.OrgDeps{Org: t.Org, Audit: t.Audit, Release: t.Release}, nil
		},
		Logger:   c.Logger,
		Mismatch: c.Metrics.CheckpointMismatch,
	}
}
