package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// scrapeTimeout bounds the database reads a scrape makes.
const scrapeTimeout = 5 * time.Second

var (
	descFollowers = prometheus.NewDesc(namespace+"_terminal_followers_active",
		"Running commands whose output this process records now.", nil, nil)
	descLiveBytes = prometheus.NewDesc(namespace+"_live_window_bytes",
		"Bytes of recent output this process keeps in memory for clients' polls of the commands it records (bounded by --live-window-mib).", nil, nil)
	descLiveEvicted = prometheus.NewDesc(namespace+"_live_window_evicted_bytes_total",
		"Bytes the live window's budget pushed out before their command's window would have let them go; polls needing them read the recording.", nil, nil)
	descLiveWaiting = prometheus.NewDesc(namespace+"_live_window_waiting_polls",
		"Clients' long-polls of followed commands waiting on this process's live window for output (polls agentd does not see).", nil, nil)
	descRunning = prometheus.NewDesc(namespace+"_terminal_commands_running",
		"Commands in state running, over every org.", nil, nil)
	descSessions = prometheus.NewDesc(namespace+"_sessions",
		"Sessions by state, over every org.", []string{"state"}, nil)
	descPoolOpen = prometheus.NewDesc(namespace+"_db_pool_open_connections",
		"Open database connections by pool (catalog, or an org).", []string{"db", "org"}, nil)
	descPoolInUse = prometheus.NewDesc(namespace+"_db_pool_in_use_connections",
		"Database connections in use by pool.", []string{"db", "org"}, nil)
	descPoolIdle = prometheus.NewDesc(namespace+"_db_pool_idle_connections",
		"Idle database connections by pool.", []string{"db", "org"}, nil)
	descPoolWaits = prometheus.NewDesc(namespace+"_db_pool_wait_count_total",
		"Connections waited for, by pool.", []string{"db", "org"}, nil)
	descPoolWaitSeconds = prometheus.NewDesc(namespace+"_db_pool_wait_seconds_total",
		"Time spent waiting for a connection, by pool.", []string{"db", "org"}, nil)
)

type gaugeCollector struct {
	g      Gauges
	perOrg bool
}

func (c *gaugeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descFollowers, descLiveBytes, descLiveEvicted, descLiveWaiting, descRunning, descSessions, descPoolOpen, descPoolInUse, descPoolIdle, descPoolWaits, descPoolWaitSeconds} {
		ch <- d
	}
}

func (c *gaugeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	if c.g.Followers != nil {
		ch <- prometheus.MustNewConstMetric(descFollowers, prometheus.GaugeValue, float64(c.g.Followers()))
	}
	if c.g.LiveWindow != nil {
		held, evicted, waiting := c.g.LiveWindow()
		ch <- prometheus.MustNewConstMetric(descLiveBytes, prometheus.GaugeValue, float64(held))
		ch <- prometheus.MustNewConstMetric(descLiveEvicted, prometheus.CounterValue, float64(evicted))
		ch <- prometheus.MustNewConstMetric(descLiveWaiting, prometheus.GaugeValue, float64(waiting))
	}
	if c.g.RunningCommands != nil {
		if n, err := c.g.RunningCommands(ctx); err == nil {
			ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(n))
		}
	}
	if c.g.SessionsByState != nil {
		if by, err := c.g.SessionsByState(ctx); err == nil {
			for state, n := range by {
				ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(n), boundLabel(state))
			}
		}
	}
	if c.g.DBPools != nil {
		c.collectPools(ch, c.g.DBPools())
	}
}

// collectPools exports the catalog pool and the org pools, per org only
// when the operator opted in (org slugs are unbounded in number).
func (c *gaugeCollector) collectPools(ch chan<- prometheus.Metric, pools map[string]PoolStats) {
	out := map[[2]string]PoolStats{}
	for name, st := range pools {
		key := [2]string{"org", "all"}
		switch {
		case name == "catalog":
			key = [2]string{"catalog", ""}
		case c.perOrg:
			key = [2]string{"org", name}
		}
		sum := out[key]
		sum.Open += st.Open
		sum.InUse += st.InUse
		sum.Idle += st.Idle
		sum.WaitCount += st.WaitCount
		sum.WaitDuration += st.WaitDuration
		out[key] = sum
	}
	for k, st := range out {
		ch <- prometheus.MustNewConstMetric(descPoolOpen, prometheus.GaugeValue, float64(st.Open), k[0], k[1])
		ch <- prometheus.MustNewConstMetric(descPoolInUse, prometheus.GaugeValue, float64(st.InUse), k[0], k[1])
		ch <- prometheus.MustNewConstMetric(descPoolIdle, prometheus.GaugeValue, float64(st.Idle), k[0], k[1])
		ch <- prometheus.MustNewConstMetric(descPoolWaits, prometheus.CounterValue, float64(st.WaitCount), k[0], k[1])
		ch <- prometheus.MustNewConstMetric(descPoolWaitSeconds, prometheus.CounterValue, st.WaitDuration.Seconds(), k[0], k[1])
	}
}
