package console

import (
	"context"
	"net/http"

	"github.com/gatehouse/gatehouse/internal/metrics"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// MetricsHandler serves /metrics; cmd/console serves it on --metrics-listen
// only, never on the public address.
func (c *Console) MetricsHandler() http.Handler { return c.Metrics.Handler() }

// watchMetrics registers the gauges read at scrape time.
func (c *Console) watchMetrics() {
	c.Metrics.Watch(metrics.Gauges{
		Followers: c.Gateway.Followers.Active,
		SessionsByState: func(ctx context.Context) (map[string]int, error) {
			return c.countByState(ctx, sessions.Session{}.TableName())
		},
		RunningCommands: func(ctx context.Context) (int, error) {
			by, err := c.countByState(ctx, recordings.Command{}.TableName())
			return by[recordings.StateRunning], err
		},
		DBPools: func() map[string]metrics.PoolStats {
			out := map[string]metrics.PoolStats{}
			if sqlDB, err := c.Catalog.DB(); err == nil {
				st := sqlDB.Stats()
				out["catalog"] = metrics.PoolStats{Open: st.OpenConnections, InUse: st.InUse, Idle: st.Idle, WaitCount: st.WaitCount, WaitDuration: st.WaitDuration}
			}
			for slug, st := range c.Orgs.PoolStats() {
				out[slug] = metrics.PoolStats{Open: st.OpenConnections, InUse: st.InUse, Idle: st.Idle, WaitCount: st.WaitCount, WaitDuration: st.WaitDuration}
			}
			return out
		},
	})
}

// countByState counts the rows of table per state over every active org.
// An org that cannot be opened is left out of the scrape.
func (c *Console) countByState(ctx context.Context, table string) (map[string]int, error) {
	slugs, err := c.activeOrgs(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, slug := range slugs {
		t, err := c.Tenants.Open(ctx, slug)
		if err != nil {
			continue
		}
		var rows []struct {
			State string
			N     int
		}
		err = t.DB.WithContext(ctx).Table(table).Select("state, COUNT(*) AS n").Group("state").Scan(&rows).Error
		t.Release()
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			out[r.State] += r.N
		}
	}
	return out, nil
}
