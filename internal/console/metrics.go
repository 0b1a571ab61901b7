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
			out := map[string]int{}
			err := c.eachOrgDB(ctx, func(slug string, count func(table, col string, dst any) error) error {
				var rows []struct {
					State string
					N     int
				}
				if err := count(sessions.Session{}.TableName(), "state", &rows); err != nil {
					return err
				}
				for _, r := range rows {
					out[r.State] += r.N
				}
				return nil
			})
			return out, err
		},
		RunningCommands: func(ctx context.Context) (int, error) {
			total := 0
			err := c.eachOrgDB(ctx, func(slug string, count func(table, col string, dst any) error) error {
				var rows []struct {
					State string
					N     int
				}
				if err := count(recordings.Command{}.TableName(), "state", &rows); err != nil {
					return err
				}
				for _, r := range rows {
					if r.State == recordings.StateRunning {
						total += r.N
					}
				}
				return nil
			})
			return total, err
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

// eachOrgDB runs fn for every active org with a grouped counter over the
// org's database. An org that cannot be opened is left out of the scrape.
func (c *Console) eachOrgDB(ctx context.Context, fn func(slug string, count func(table, col string, dst any) error) error) error {
	slugs, err := c.activeOrgs(ctx)
	if err != nil {
		return err
	}
	for _, slug := range slugs {
		t, err := c.Tenants.Open(ctx, slug)
		if err != nil {
			continue
		}
		db := t.DB.WithContext(ctx)
		err = fn(slug, func(table, col string, dst any) error {
			return db.Table(table).Select(col + " AS state, COUNT(*) AS n").Group(col).Scan(dst).Error
		})
		t.Release()
		if err != nil {
			return err
		}
	}
	return nil
}
