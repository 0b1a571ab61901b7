package console

import (
	"context"

	"github.com/gatehouse/gatehouse/internal/retention"
)

// newRetention is the loop applying every org's retention policy; with
// several replicas an advisory lock per org lets one apply it.
func (c *Console) newRetention() *retention.Runner {
	return &retention.Runner{
		ListOrgs: c.activeOrgs,
		OpenOrg: func(ctx context.Context, slug string) (retention.OrgDeps, error) {
			t, err := c.Tenants.Open(ctx, slug)
			if err != nil {
				return retention.OrgDeps{}, err
			}
			return retention.OrgDeps{DB: t.DB, Audit: t.Audit, Release: t.Release}, nil
		},
		Interval: c.Config.RetentionInterval,
		Logger:   c.Logger,
		Metrics:  c.Metrics,
	}
}
