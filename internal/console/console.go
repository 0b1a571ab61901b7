// Package console assembles the running console from its configuration:
// catalog database, master key, signing key, domain services and the HTTP
// server. main and the end-to-end tests build it the same way.
package console

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd/release"
	"github.com/gatehouse/gatehouse/internal/anchor"
	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/e2b"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/handlers"
	"github.com/gatehouse/gatehouse/internal/metrics"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/platform"
	"github.com/gatehouse/gatehouse/internal/retention"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/tenant"
	"github.com/gatehouse/gatehouse/internal/terminal"
)

// Console is the assembled application.
type Console struct {
	Config   config.Config
	Catalog  *gorm.DB
	Box      *sealed.Box
	Orgs     *orgs.Service
	Platform *platform.Service
	Audit    *audit.Log
	Server   *handlers.Server
	// E2B resolves the E2B-compatible data plane's sandbox ids and tokens.
	E2B     *e2b.Service
	Tenants *tenant.Registry
	// Anchors keeps signed checkpoints of every org's audit chain head in
	// the catalog; Checkpoints is the loop that takes them.
	Anchors     *anchor.Service
	Checkpoints *anchor.Runner
	// Metrics is the process's Prometheus registry and collectors.
	Metrics *metrics.Metrics
	// Retention applies each org's audit and recording retention policy.
	Retention *retention.Runner
	Health    *envs.Checker
	// Reclaim is the sandbox reclaim loop; Local the optional local
	// sandbox backend (--local-sandboxes).
	Reclaim *sessions.Reclaimer
	Local   *LocalSandboxes
	// SessionsRT is the agent-session runtime shared by every request.
	SessionsRT *sessions.Runtime
	// Approvals releases this process's approval waiters when a request
	// is decided here (other replicas' waiters read the row): the handlers
	// and the gateway share it. See Console.ApprovalQueue.
	Approvals *approvals.Notifier
	// ApprovalWebhook posts new requests to each org's webhook.
	ApprovalWebhook *approvals.Webhook
	// Gateway is the terminal gateway; its followers record commands.
	Gateway *gateway.Gateway
	// Terminal bridges browser terminals to the gateway.
	Terminal *terminal.Bridge
	// Envd is the E2B-compatible data plane (envd's API over the
	// gateway), served on the main listener for Hosts 49983-<id>.<domain>.
	Envd   *e2b.Server
	stop   context.CancelFunc
	done   chan struct{}
	Logger *slog.Logger
	// OneTimePassword is set when this start created the first admin with
	// a generated password; main prints it once.
	OneTimePassword string
	AdminEmail      string
	AdminCreated    bool
}

// OpenCatalog opens and migrates the catalog database named by cfg.
func OpenCatalog(ctx context.Context, cfg config.Config) (*gorm.DB, error) {
	dsn := cfg.DatabaseURL
	if dsn == "" {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("create data dir: %w", err)
		}
		dsn = filepath.Join(cfg.DataDir, "catalog.db")
		// Create it private before SQLite does with the umask's mode.
		if f, err := os.OpenFile(dsn, os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			_ = f.Close()
		}
	}
	db, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 20, MaxIdleConns: 5})
	if err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	if _, err := store.Migrate(ctx, db, store.CatalogSet); err != nil {
		_ = store.Close(db)
		return nil, fmt.Errorf("catalog: %w", err)
	}
	return db, nil
}

// LoadMasterKey takes GATEHOUSE_MASTER_KEY or, in the embedded default only,
// the key file in the data dir (created on first start). With Postgres a
// key must be given: a generated one on one replica's disk would strand
// every other replica.
func LoadMasterKey(cfg config.Config) (*sealed.Box, error) {
	var key []byte
	var err error
	switch {
	case cfg.MasterKey != "":
		key, err = sealed.ParseKey(cfg.MasterKey)
	case cfg.DatabaseURL != "":
		return nil, fmt.Errorf("GATEHOUSE_MASTER_KEY is required with DATABASE_URL (generate one with: openssl rand -hex 32)")
	default:
		key, err = sealed.LoadOrCreateKeyFile(filepath.Join(cfg.DataDir, "master.key"))
	}
	if err != nil {
		return nil, fmt.Errorf("master key: %w", err)
	}
	return sealed.New(key)
}

// New builds the console. Close it when done.
func New(ctx context.Context, cfg config.Config, logger *slog.Logger) (*Console, error) {
	if logger == nil {
		logger = slog.Default()
	}
	// Every path under the data dir is used as given by code that may run
	// elsewhere (a local sandbox's agentd starts in its own directory), so
	// a relative one is made absolute once, at start.
	if cfg.DataDir != "" {
		abs, err := filepath.Abs(cfg.DataDir)
		if err != nil {
			return nil, fmt.Errorf("data dir %q: %w", cfg.DataDir, err)
		}
		cfg.DataDir = abs
	}
	box, err := LoadMasterKey(cfg)
	if err != nil {
		return nil, err
	}
	cat, err := OpenCatalog(ctx, cfg)
	if err != nil {
		return nil, err
	}
	kid, key, err := auth.LoadOrCreateSigningKey(ctx, cat, box, "catalog")
	if err != nil {
		_ = store.Close(cat)
		return nil, err
	}
	c := &Console{Config: cfg, Catalog: cat, Box: box, Logger: logger,
		Metrics: metrics.New(metrics.Options{PerOrgDB: cfg.MetricsPerOrgDB})}
	c.Audit = audit.NewLog(cat, audit.PlatformTable, nil).Observe(c.Metrics.AuditAppended)
	c.Anchors = &anchor.Service{Catalog: cat, Box: box, Audit: c.Audit}
	c.Platform = &platform.Service{
		DB:       cat,
		Signer:   auth.NewSigner(kid, key, "platform", cfg.TokenTTL, nil),
		Throttle: auth.NewThrottle(nil),
		Sleep:    sleepCtx,
		// Passwords: the config's cost (zero, the default, unless a test
		// lowers it).
		Passwords: cfg.PasswordCost,
	}
	orgCfg := orgs.Config{Catalog: cat, Box: box, Audit: c.Audit, DataDir: cfg.DataDir, DBPrefix: cfg.OrgDBPrefix, Logger: logger}
	if cfg.DatabaseURL != "" {
		orgCfg.ServerDSN = cfg.DatabaseURL
	}
	c.Orgs = orgs.New(orgCfg)
	// Finish what a crash left half-way before serving: no request may see
	// an org that is half created or half deleted.
	c.reconcile(ctx)
	c.AdminEmail = auth.NormalizeEmail(cfg.AdminEmail)
	if c.AdminEmail == "" {
		c.AdminEmail = "admin@localhost.localdomain"
	}
	if err := c.bootstrapAdmin(ctx); err != nil {
		c.Close()
		return nil, err
	}
	c.Tenants = &tenant.Registry{Orgs: c.Orgs, Box: box, TokenTTL: cfg.TokenTTL, AuditObserver: c.Metrics.AuditAppended, Passwords: cfg.PasswordCost}
	c.Health = &envs.Checker{
		ListOrgs: c.activeOrgs,
		OpenOrg: func(ctx context.Context, slug string) (envs.OrgDeps, error) {
			t, err := c.Tenants.Open(ctx, slug)
			if err != nil {
				return envs.OrgDeps{}, err
			}
			return envs.OrgDeps{Envs: &envs.Service{DB: t.DB, Box: box, Org: slug}, Audit: t.Audit, Release: t.Release}, nil
		},
		Interval: cfg.HealthInterval,
		Logger:   logger,
		Observe:  c.Metrics.HealthProbe,
	}
	c.SessionsRT = sessions.NewRuntime()
	c.SessionsRT.UnreachableWindow = cfg.UnreachableWindow
	c.Gateway = c.newGateway()
	c.Terminal = &terminal.Bridge{Gateway: c.Gateway, Logger: logger}
	c.Envd = &e2b.Server{Gateway: c.Gateway, Resolver: e2b.NoSandboxes{}, TrustProxy: cfg.TrustProxy, Logger: logger}
	c.SessionsRT.Limits = sessions.Limits{OpenPerUser: cfg.MaxOpenSessionsPerUser, OpenPerAgent: cfg.MaxOpenSessionsPerAgent}
	c.Gateway.Recorded = c.Metrics.GatewayRecorded
	c.Gateway.Limits = gateway.CommandLimits{RunningPerUser: cfg.MaxRunningCommandsPerUser, RunningPerAgent: cfg.MaxRunningCommandsPerAgent}
	c.Reclaim = &sessions.Reclaimer{
		ListOrgs: c.activeOrgs,
		OpenOrg: func(ctx context.Context, slug string) (sessions.OrgDeps, error) {
			t, err := c.Tenants.Open(ctx, slug)
			if err != nil {
				return sessions.OrgDeps{}, err
			}
			return sessions.OrgDeps{Sessions: c.orgSessions(t, slug), Release: t.Release}, nil
		},
		Interval: cfg.ReclaimInterval,
		Logger:   logger,
	}
	if cfg.LocalSandboxes {
		if c.Local, err = StartLocalSandboxesFrom(cfg.DataDir, cfg.LocalAgentd, logger); err != nil {
			c.Close()
			return nil, err
		}
		logger.Warn(c.Local.Describe())
	}
	// The E2B data plane resolves sandbox ids through the same sessions
	// services as the terminal gateway.
	c.E2B = &e2b.Service{Tenants: c.Tenants, Box: box, Sessions: func(t *tenant.Tenant) *sessions.Service { return c.orgSessions(t, t.Org.Slug) }}
	c.Envd.Resolver = c.E2B
	c.Server = c.newServer(box)
	c.watchMetrics()
	c.Retention = c.newRetention()
	c.Checkpoints = c.newCheckpoints()
	return c, nil
}

// newServer builds the HTTP surfaces over what New built, with the
// approval queue's notifier and webhook they share with the gateway.
func (c *Console) newServer(box *sealed.Box) *handlers.Server {
	cfg, logger, cat := c.Config, c.Logger, c.Catalog
	c.Approvals = approvals.NewNotifier()
	// The webhook builds its own client: it follows no redirect and
	// reaches neither this machine nor a private or metadata address
	// (approvals.WebhookAddr) but those the operator allowed; an org admin
	// chose the address.
	c.ApprovalWebhook = &approvals.Webhook{Allow: cfg.ApprovalWebhookNets, Box: box, Logger: logger, Counted: c.Metrics.ApprovalWebhook}
	c.askOverApprovals()
	return handlers.New(handlers.Deps{
		ApprovalNotifier: c.Approvals,
		ApprovalQueue:    c.ApprovalQueue,
		ApprovalRule:     approvalRule,
		Gateway:          c.Gateway, Terminal: c.Terminal, SessionsRT: c.SessionsRT, BaseURL: cfg.BaseURL,
		Catalog: cat, Orgs: c.Orgs, Platform: c.Platform, PlatformAudit: c.Audit, Tenants: c.Tenants,
		Throttle: c.Platform.Throttle, Sleep: sleepCtx, Logger: logger, Box: box,
		SecureCookies: cfg.SecureCookies, TrustProxy: cfg.TrustProxy, Metrics: c.Metrics,
		Anchors: c.Anchors, Local: c.Local.backend(),
		E2B:    handlers.E2BEndpoint{Service: c.E2B, Domain: cfg.E2BDomain, PublicURL: cfg.E2BPublicURL},
		Agentd: &release.Catalog{Self: cfg.AgentdSelf, Dir: cfg.AgentdDir},
	})
}

// bootstrapAdmin creates the first platform admin from the config when
// there is none, and records it in the platform audit log in the same
// transaction: a failed record leaves no admin, so the next start tries
// both again. Replicas starting at once create one admin between them.
func (c *Console) bootstrapAdmin(ctx context.Context) error {
	return c.Catalog.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Replicas starting together on an empty catalog take turns: the
		// second finds the first's admin instead of failing to start on
		// its duplicate.
		if err := store.XactLock(tx, "gatehouse-bootstrap-admin"); err != nil {
			return err
		}
		created, otp, err := (&platform.Service{DB: tx, Now: c.Platform.Now, Passwords: c.Platform.Passwords}).Bootstrap(ctx, c.Config.AdminEmail, c.Config.AdminPassword)
		if err != nil || !created {
			return err
		}
		if _, err := c.Audit.AppendTx(ctx, tx, audit.Event{Actor: audit.Actor{Type: audit.ActorSystem, Name: "bootstrap"},
			Action: platform.ActionAdminCreate, Target: audit.Target{Type: audit.ActorPlatformAdmin, Name: c.AdminEmail}}); err != nil {
			return err
		}
		c.AdminCreated, c.OneTimePassword = true, otp
		return nil
	})
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// activeOrgs lists the slugs of orgs that are not suspended.
func (c *Console) activeOrgs(ctx context.Context) ([]string, error) {
	list, err := c.Orgs.List(ctx, "", 0)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, o := range list {
		if o.Status == orgs.StatusActive {
			out = append(out, o.Slug)
		}
	}
	return out, nil
}

// ReconcileInterval is how often the org reconciler runs after the round
// at start; with several replicas an advisory lock lets one do it.
const ReconcileInterval = time.Minute

// reconcile runs one reconciler round and logs what it did. A round that
// fails (a database down) is retried at the next tick.
func (c *Console) reconcile(ctx context.Context) {
	rep, err := c.Orgs.Reconcile(ctx)
	if err != nil {
		c.Logger.Warn("org reconciler: round incomplete; it runs again shortly", "error", err)
	}
	if len(rep.Finished) > 0 {
		c.Logger.Info("org reconciler: finished interrupted org changes", "orgs", rep.Finished)
	}
}

// Start runs the background loops (environment health, org reconciler)
// until Close.
func (c *Console) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	c.stop, c.done = cancel, make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		c.Health.Run(ctx)
	}()
	if err := c.Gateway.Followers.Start(ctx); err != nil {
		c.Logger.Error("recording followers not started", "error", err)
	}
	go func() {
		defer wg.Done()
		// Commands whose follower died (a replica stopped) are adopted
		// at start and then every few seconds.
		t := time.NewTicker(c.sweepInterval())
		defer t.Stop()
		c.Gateway.Followers.Run(ctx, t.C)
	}()
	go func() {
		defer wg.Done()
		t := time.NewTicker(ReconcileInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.reconcile(ctx)
			}
		}
	}()
	wg.Add(2)
	go func() {
		defer wg.Done()
		c.Reclaim.Run(ctx)
	}()
	go func() {
		defer wg.Done()
		c.Retention.Run(ctx)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(anchor.Interval)
		defer t.Stop()
		c.Checkpoints.Run(ctx, t.C)
	}()
	go func() {
		wg.Wait()
		close(c.done)
	}()
}

// FollowerSweepInterval is how often running commands without a live
// recording follower are looked for, unless the config says otherwise.
const FollowerSweepInterval = 10 * time.Second

func (c *Console) sweepInterval() time.Duration {
	if c.Config.FollowerSweepInterval > 0 {
		return c.Config.FollowerSweepInterval
	}
	return FollowerSweepInterval
}

// Handler is the HTTP handler to serve.
//
// A request whose Host is a sandbox's envd address (49983-<id>.<domain>),
// or that names its sandbox in the E2b-Sandbox-Id header (the SDK's
// E2B_SANDBOX_URL set to the console's URL), goes to the E2B data plane
// before the console's router sees it: the SDK's paths
// (/process.Process/Start, /files) mean nothing to the console, and none
// of the console's own requests carry that header.
func (c *Console) Handler() http.Handler {
	envd := c.Envd.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e2b.SandboxID(r) != "" {
			envd.ServeHTTP(w, r)
			return
		}
		c.Server.ServeHTTP(w, r)
	})
}

// EnvdHandler is the E2B data plane alone (--e2b-listen): every request
// is envd's, its sandbox named by Host or the E2b-Sandbox-Id header.
func (c *Console) EnvdHandler() http.Handler { return c.Envd.Handler() }

// Close releases databases and background loops.
func (c *Console) Close() {
	if c.stop != nil {
		c.stop()
		<-c.done
	}
	if c.Gateway != nil {
		c.Gateway.Followers.Stop()
	}
	if c.Local != nil {
		_ = c.Local.Close()
	}
	if c.Orgs != nil {
		c.Orgs.Close()
	}
	if c.Catalog != nil {
		_ = store.Close(c.Catalog)
	}
}
