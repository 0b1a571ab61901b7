package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// childEnv carries the child console's configuration (JSON); its presence
// makes TestCrashChild act as the child.
const childEnv = "GATEHOUSE_TEST_CRASH_CHILD"

// crashSlugs are the orgs the child keeps creating and deleting.
var crashSlugs = []string{"org-a", "org-b", "org-c", "org-d"}

const testMasterKey = "4f2a9c1e7b3d5a8f0c6e2b4d9a1f3c5e7b9d0a2c4e6f8a1b3d5c7e9f0a2b4c6d"

// crashRounds is how many times the console is killed per dialect.
const crashRounds = 20

// TestCrashChild is the console process TestKilledProvisioning kills. Run
// normally it has nothing to do and passes.
func TestCrashChild(t *testing.T) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		return
	}
	var cfg config.Config
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// New runs the reconciler round before it returns.
	c, err := console.New(context.Background(), cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	c.Start()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() && in.Text() == "recreate" {
		recreate(c)
	}
	if in.Text() != "go" {
		c.Close()
		return
	}
	// Create and delete orgs as fast as possible until killed.
	var wg sync.WaitGroup
	for range len(crashSlugs) {
		wg.Go(func() {
			ctx := context.Background()
			for {
				slug := crashSlugs[rand.IntN(len(crashSlugs))]
				if _, err := c.Orgs.Get(ctx, slug); err == nil {
					_, _ = c.Orgs.Delete(ctx, slug, slug)
				} else {
					_, _ = c.Orgs.Create(ctx, orgs.CreateInput{Slug: slug})
				}
			}
		})
	}
	wg.Wait()
}

// recreate deletes (if need be) and creates every slug again, as a
// console would on an admin's request, and reports each failure on stdout.
func recreate(c *console.Console) {
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, slug := range crashSlugs {
		wg.Go(func() {
			var err error
			if _, gerr := c.Orgs.Get(ctx, slug); gerr == nil {
				_, err = c.Orgs.Delete(ctx, slug, slug)
			}
			if err == nil {
				_, err = c.Orgs.Create(ctx, orgs.CreateInput{Slug: slug})
			}
			if err != nil {
				mu.Lock()
				fmt.Printf("recreate-error %s: %v\n", slug, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Println("recreated")
}

// TestKilledProvisioning kills a console (a real child process, SIGKILL)
// at random points while it creates and deletes orgs, crashRounds times.
// After each restart, whose start runs one reconciler round: no unfinished
// org row is left, every active org's database exists and is fully
// migrated, no org database or file exists without a row, the platform
// audit chain verifies, and every slug can be deleted and created again.
func TestKilledProvisioning(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		if d == store.Postgres {
			storetest.Crowded(t)
		}
		cfg := config.Config{DataDir: t.TempDir(), MasterKey: testMasterKey, AdminEmail: "admin@example.com",
			AdminPassword: "a long enough password", TokenTTL: time.Hour, HealthInterval: time.Hour,
			OrgDBPrefix: storetest.NewName("gh_test_crash_") + "_", Listen: "127.0.0.1:0"}
		if d == store.Postgres {
			cfg.DatabaseURL = storetest.DSN(t, store.Postgres)
			storetest.DropPrefixedAtCleanup(t, cfg.OrgDBPrefix)
		}
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 16))
		reconciled := 0
		for round := 0; round <= crashRounds; round++ {
			child := startChild(t, cfg)
			if round > 0 {
				checkInvariants(t, cfg, d, round)
				child.recreate(t, round)
				if t.Failed() {
					t.FailNow()
				}
			}
			if round == crashRounds {
				child.stop(t)
				break
			}
			child.goAndKill(t, time.Duration(rng.IntN(700))*time.Millisecond)
		}
		// The reconciler recorded what it did.
		cat := openCatalog(t, cfg)
		var n int64
		if err := cat.Table(audit.PlatformTable).Where("action LIKE ?", "org.reconcile_%").Count(&n).Error; err != nil {
			t.Fatal(err)
		}
		reconciled = int(n)
		t.Logf("%s: %d reconciler actions over %d kills", d, reconciled, crashRounds)
		if reconciled == 0 {
			t.Error("no kill interrupted a creation or deletion; the test exercised nothing")
		}
	})
}

type childProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startChild(t *testing.T, cfg config.Config) *childProc {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	cmd.Stderr = &prefixWriter{t: t}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &childProc{cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	p.await(t, "ready")
	return p
}

// await reads the child's output up to the line want and returns the
// lines before it.
func (p *childProc) await(t *testing.T, want string) []string {
	t.Helper()
	var before []string
	timeout := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				t.Fatalf("child exited before %q", want)
			}
			if line == want {
				return before
			}
			before = append(before, line)
		case <-timeout:
			t.Fatalf("child did not say %q within a minute", want)
		}
	}
}

// recreate has the child delete and create every slug again.
func (p *childProc) recreate(t *testing.T, round int) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, "recreate\n"); err != nil {
		t.Fatal(err)
	}
	for _, line := range p.await(t, "recreated") {
		t.Errorf("round %d: %s", round, line)
	}
}

// goAndKill starts the child's workload and SIGKILLs it after d.
func (p *childProc) goAndKill(t *testing.T, d time.Duration) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(d)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

func (p *childProc) stop(t *testing.T) {
	t.Helper()
	_ = p.stdin.Close()
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("child console did not stop cleanly: %v", err)
	}
}

// prefixWriter passes the child's log to the test log.
type prefixWriter struct{ t *testing.T }

func (w *prefixWriter) Write(b []byte) (int, error) {
	w.t.Log("child: " + strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func openCatalog(t *testing.T, cfg config.Config) *gorm.DB {
	t.Helper()
	dsn := cfg.DatabaseURL
	if dsn == "" {
		dsn = filepath.Join(cfg.DataDir, "catalog.db")
	}
	db, err := store.Open(context.Background(), dsn, store.Options{MaxOpenConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close(db) })
	return db
}

// checkInvariants inspects what a killed console left after the restarted
// one's reconciler round. It only reads: the child console has the org
// databases open, and only it may change them.
func checkInvariants(t *testing.T, cfg config.Config, d store.Dialect, round int) {
	t.Helper()
	ctx := context.Background()
	cat := openCatalog(t, cfg)
	key, err := sealed.ParseKey(cfg.MasterKey)
	if err != nil {
		t.Fatal(err)
	}
	box, err := sealed.New(key)
	if err != nil {
		t.Fatal(err)
	}
	svc := orgs.New(orgs.Config{Catalog: cat, Box: box, DataDir: cfg.DataDir, ServerDSN: cfg.DatabaseURL,
		DBPrefix: cfg.OrgDBPrefix, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer svc.Close()
	list, err := svc.List(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{}
	for _, o := range list {
		if o.Status != orgs.StatusActive && o.Status != orgs.StatusSuspended {
			t.Errorf("round %d: org %s left %s after the reconciler round", round, o.Slug, o.Status)
			continue
		}
		live[o.Slug] = true
		if v := orgVersion(t, cfg, d, o.Slug); v != latestOrgVersion(t, d) {
			t.Errorf("round %d: active org %s has its database at migration %d, want %d", round, o.Slug, v, latestOrgVersion(t, d))
		}
	}
	// Independently of the code under test: what exists on disk or on the
	// server must belong to a live org.
	for _, slug := range existingOrgData(t, cfg, d) {
		if !live[slug] {
			t.Errorf("round %d: database of %s exists without an org", round, slug)
		}
	}
	if orphans, err := svc.Orphans(ctx); err != nil || len(orphans) > 0 {
		t.Errorf("round %d: orphans reported: %v, %v", round, orphans, err)
	}
	res, err := audit.NewLog(cat, audit.PlatformTable, nil).Verify(ctx)
	if err != nil || !res.OK {
		t.Errorf("round %d: platform audit chain: %+v, %v", round, res, err)
	}
}

// orgVersion reads the highest applied migration of an org's database.
func orgVersion(t *testing.T, cfg config.Config, d store.Dialect, slug string) int {
	t.Helper()
	dsn := filepath.Join(cfg.DataDir, "orgs", slug+".db")
	if d == store.Postgres {
		var err error
		if dsn, err = store.WithDatabase(cfg.DatabaseURL, cfg.OrgDBPrefix+strings.ReplaceAll(slug, "-", "_")); err != nil {
			t.Fatal(err)
		}
	}
	db, err := store.Open(context.Background(), dsn, store.Options{MaxOpenConns: 1})
	if err != nil {
		t.Errorf("open %s database: %v", slug, err)
		return -1
	}
	defer store.Close(db)
	var v int
	if err := db.Raw("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").Scan(&v).Error; err != nil {
		return 0
	}
	return v
}

func latestOrgVersion(t *testing.T, d store.Dialect) int {
	t.Helper()
	ms, err := store.Migrations(store.OrgSet, d)
	if err != nil {
		t.Fatal(err)
	}
	return ms[len(ms)-1].Version
}

// existingOrgData lists the slugs whose database or file exists.
func existingOrgData(t *testing.T, cfg config.Config, d store.Dialect) []string {
	t.Helper()
	var out []string
	if d == store.Postgres {
		var names []string
		storetest.Admin(t).Raw("SELECT datname FROM pg_database WHERE left(datname, ?) = ?", len(cfg.OrgDBPrefix), cfg.OrgDBPrefix).Scan(&names)
		for _, n := range names {
			out = append(out, strings.ReplaceAll(strings.TrimPrefix(n, cfg.OrgDBPrefix), "_", "-"))
		}
		return out
	}
	entries, err := os.ReadDir(filepath.Join(cfg.DataDir, "orgs"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		for _, suffix := range []string{"-wal", "-shm", "-journal", ".db"} {
			name = strings.TrimSuffix(name, suffix)
		}
		out = append(out, name)
	}
	return out
}
