package console

import (
	"context"
	"database/sql"
	"net/http"

	"gorm.io/gorm"

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
		LiveWindow: func() (int64, int64, int) {
			u := c.Gateway.Followers.LiveWindow()
			return u.Held, u.Evicted, u.Waiting
		},
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
				out["catalog"] = poolStats(sqlDB.Stats())
			}
			for slug, st := range c.Orgs.PoolStats() {
				out[slug] = poolStats(st)
			}
			return out
		},
	})
}

// poolStats is the part of a pool's statistics the metrics export.
func poolStats(st sql.DBStats) metrics.PoolStats {
	return metrics.PoolStats{Open: st.OpenConnections, InUse: st.InUse, Idle: st.Idle, WaitCount: st.WaitCount, WaitDuration: st.WaitDuration}
}

// countByState counts the rows of table per state over the orgs whose
// database is open. A scrape opens none (an idle org's pool closes after
// Config.IdleClose); an org with running commands is open, its followers hold it.
func (c *Console) countByState(ctx context.Context, table string) (map[string]int, error) {
	out := map[string]int{}
	err := c.Orgs.EachOpen(func(_ string, db *gorm.DB) error {
		var rows []struct {
			State string
			N     int
		}
		if err := db.WithContext(ctx).Table(table).Select("state, COUNT(*) AS n").Group("state").Scan(&rows).Error; err != nil {
			return err
		}
		for _, r := range rows {
			out[r.State] += r.N
		}
		return nil
	})
	return out, err
}
