// Package config reads the console's configuration from flags and the
// environment. Flags win over the environment; defaults give the embedded
// zero-configuration mode.
package config

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/auth"
)

// Config is the console's configuration.
type Config struct {
	Listen        string
	DataDir       string
	DatabaseURL   string
	MasterKey     string
	AdminEmail    string
	AdminPassword string
	// BaseURL is where people reach the console; printed at start.
	BaseURL string
	// SecureCookies marks cookies Secure; on by default unless listening
	// on loopback over plain HTTP.
	SecureCookies bool
	// TrustProxy takes the client address from X-Forwarded-For / X-Real-IP.
	TrustProxy bool
	// OrgDBPrefix names created Postgres org databases.
	OrgDBPrefix string
	// TokenTTL is how long a sign-in lasts.
	TokenTTL time.Duration
	// PasswordCost is the argon2id cost of the password hashes the
	// console makes for accounts and sign-ins (an account created by SSO
	// keeps the default for its unused one-time password); zero is
	// auth.DefaultPasswordCost. No flag or
	// variable sets it: only tests lower it, so that the thousands of
	// accounts they create do not take minutes under the race detector.
	PasswordCost auth.PasswordCost
	// HealthInterval is how often every environment is probed.
	HealthInterval time.Duration
	// ReclaimInterval is how often the sandbox reclaim round runs.
	ReclaimInterval time.Duration
	// FollowerLease is how long a recording follower's claim on a running
	// command lasts without a write: after a replica dies, another adopts
	// its commands once their leases lapse.
	FollowerLease time.Duration
	// LiveWindowMiB bounds, in MiB, the recent output of every command
	// this process records kept in memory for clients' polls; output
	// past it is read from the recording.
	LiveWindowMiB int
	// FollowerSweepInterval is how often running commands without a live
	// follower are looked for (and adopted).
	FollowerSweepInterval time.Duration
	// ApprovalWebhookAllow are the private networks (comma-separated CIDR
	// prefixes) approval webhooks may be posted to, an on-premises chat
	// server's, say; none by default. The console's own machine and the
	// metadata addresses stay refused whatever it says.
	ApprovalWebhookAllow string
	// ApprovalWebhookNets is ApprovalWebhookAllow parsed.
	ApprovalWebhookNets []netip.Prefix
	// UnreachableWindow is how long a session's agentd may fail every call
	// before the session is lost; shorter outages leave it and its
	// commands running.
	UnreachableWindow time.Duration
	// LocalSandboxes starts the built-in local sandbox backend (the fake:
	// agentd processes on this machine, no isolation) for trying
	// per-session sandboxes with no other set-up.
	LocalSandboxes bool
	// LocalAgentd is the agentd binary local sandboxes run; "" looks next
	// to the console, then on PATH, then builds ./cmd/agentd.
	LocalAgentd string
	// AgentdDir holds release builds of agentd (agentd-<os>-<arch>, .exe
	// for Windows; scripts/release-agentd writes them) that the console
	// serves at /downloads/agentd/ besides its own platform's; "" none.
	AgentdDir string
	// AgentdSelf is a binary that runs as agentd on the console's own
	// platform, served at /downloads/agentd/<os>-<arch>. cmd/console sets
	// it to its own executable, which is agentd when started under that
	// name; it has no flag.
	AgentdSelf string
	// MetricsListen is the address /metrics is served on; empty serves no
	// metrics. It is a separate listener so the metrics never share the
	// public address.
	MetricsListen string
	// MetricsPerOrgDB labels database pool stats and retention rounds with org slugs (an
	// unbounded label set, hence opt-in); off, org pools are summed.
	MetricsPerOrgDB bool
	// RetentionInterval is how often each org's retention policy is applied.
	RetentionInterval time.Duration
	// E2BDomain is the wildcard domain of the E2B-compatible data plane:
	// the SDK reaches a sandbox's envd at 49983-<sandboxID>.<E2BDomain>.
	// Empty: answers carry a placeholder domain that resolves nowhere, so
	// a runtime must set E2B_SANDBOX_URL.
	E2BDomain string
	// E2BListen is the address the E2B data plane (envd's API) is served
	// on; empty serves none of its own.
	E2BListen string
	// E2BPublicURL is where runtimes reach the E2B data plane as one host
	// (E2B_SANDBOX_URL); empty: http://<E2BListen> when that is set, else
	// the console's BaseURL.
	E2BPublicURL string
	// LogLevel is the lowest level logged: debug shows the rounds of the
	// background loops that changed nothing (retention, for one).
	LogLevel slog.Level
	// MaxOpenSessionsPerUser and MaxOpenSessionsPerAgent cap the sessions
	// open (pending, running or paused) at once per user (or service key)
	// and per agent; MaxRunningCommandsPerUser and
	// MaxRunningCommandsPerAgent cap the commands running at once in the
	// sessions of one user and of one agent. 0 turns a cap off (Load gives
	// the Default… values).
	MaxOpenSessionsPerUser     int
	MaxOpenSessionsPerAgent    int
	MaxRunningCommandsPerUser  int
	MaxRunningCommandsPerAgent int
}

// Default caps: generous for a person or an agent runtime at work, small
// enough that a loop creating sessions or starting commands stops long
// before it exhausts the sandboxes or hosts of an org.
const (
	DefaultMaxOpenSessionsPerUser     = 20
	DefaultMaxOpenSessionsPerAgent    = 200
	DefaultMaxRunningCommandsPerUser  = 20
	DefaultMaxRunningCommandsPerAgent = 100
)

// DefaultLiveWindowMiB is recorder.DefaultLiveBudget in MiB.
const DefaultLiveWindowMiB = 256

// Load parses args (without the program name) with getenv for defaults.
// Its flags may stand anywhere on the line, before or after a command and
// among the command's own flags (see Split); everything else is returned,
// in order, for the command to parse.
func Load(name string, args []string, getenv func(string) string, out io.Writer) (Config, []string, error) {
	var c Config
	fs, err := flagSet(name, &c, getenv, out)
	if err != nil {
		return c, nil, err
	}
	own, rest, err := split(fs, args)
	if err != nil {
		return c, nil, err
	}
	if err := fs.Parse(own); err != nil {
		return c, nil, err
	}
	if err := c.finish(getenv); err != nil {
		return c, nil, err
	}
	return c, rest, nil
}

// Split separates the console's own flags (those Load defines) from the
// rest of a command line, wherever they stand: `console --data-dir D
// audit verify --org x` and `console audit verify --org x --data-dir D`
// give the same flags and the same rest (audit verify --org x). A flag
// that takes a value takes the next argument unless written --flag=value.
// Everything after "--" is rest. A command's own flags must therefore
// not reuse a console flag's name: the console's would take it.
func Split(args []string) (own, rest []string, err error) {
	fs, err := flagSet("console", &Config{}, func(string) string { return "" }, io.Discard)
	if err != nil {
		return nil, nil, err
	}
	return split(fs, args)
}

// PrintDefaults writes the console's flags, with their defaults from
// getenv, to out.
func PrintDefaults(getenv func(string) string, out io.Writer) error {
	fs, err := flagSet("console", &Config{}, getenv, out)
	if err != nil {
		return err
	}
	fs.PrintDefaults()
	return nil
}

func split(fs *flag.FlagSet, args []string) (own, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return own, append(rest, args[i:]...), nil
		}
		name, inline, ok := flagName(a)
		f := fs.Lookup(name)
		if !ok || f == nil {
			rest = append(rest, a)
			continue
		}
		own = append(own, a)
		if inline || isBool(f) {
			continue
		}
		if i+1 == len(args) {
			return nil, nil, fmt.Errorf("flag needs an argument: --%s", name)
		}
		i++
		own = append(own, args[i])
	}
	return own, rest, nil
}

// flagName is the name of a -flag, --flag or --flag=value argument, and
// whether it carries its value.
func flagName(a string) (name string, inline, ok bool) {
	if len(a) < 2 || a[0] != '-' {
		return "", false, false
	}
	name = a[1:]
	if name[0] == '-' {
		name = name[1:]
	}
	if name == "" || name[0] == '-' || name[0] == '=' {
		return "", false, false
	}
	if i := strings.IndexByte(name, '='); i >= 0 {
		return name[:i], true, true
	}
	return name, false, true
}

// isBool reports a flag that takes no value (as the flag package decides).
func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// flagSet defines the console's flags on c, with defaults from getenv.
func flagSet(name string, c *Config, getenv func(string) string, out io.Writer) (*flag.FlagSet, error) {
	env := func(k, def string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.Listen, "listen", env("GATEHOUSE_LISTEN", "127.0.0.1:8080"), "address to serve on (GATEHOUSE_LISTEN)")
	fs.StringVar(&c.DataDir, "data-dir", env("GATEHOUSE_DATA_DIR", "data"), "directory for SQLite databases and the generated master key (GATEHOUSE_DATA_DIR)")
	fs.StringVar(&c.BaseURL, "base-url", env("GATEHOUSE_BASE_URL", ""), "public URL of the console (GATEHOUSE_BASE_URL)")
	fs.StringVar(&c.OrgDBPrefix, "org-db-prefix", env("GATEHOUSE_ORG_DB_PREFIX", "gatehouse_org_"), "name prefix of per-org Postgres databases (GATEHOUSE_ORG_DB_PREFIX)")
	trust, _ := strconv.ParseBool(env("GATEHOUSE_TRUST_PROXY", "false"))
	fs.BoolVar(&c.TrustProxy, "trust-proxy", trust, "take client addresses from X-Forwarded-For (GATEHOUSE_TRUST_PROXY)")
	ttl, err := time.ParseDuration(env("GATEHOUSE_TOKEN_TTL", "12h"))
	if err != nil {
		return nil, fmt.Errorf("GATEHOUSE_TOKEN_TTL: %w", err)
	}
	fs.DurationVar(&c.TokenTTL, "token-ttl", ttl, "how long a sign-in lasts (GATEHOUSE_TOKEN_TTL)")
	hi, err := time.ParseDuration(env("GATEHOUSE_HEALTH_INTERVAL", "30s"))
	if err != nil {
		return nil, fmt.Errorf("GATEHOUSE_HEALTH_INTERVAL: %w", err)
	}
	fs.DurationVar(&c.HealthInterval, "health-interval", hi, "how often environments are health-checked (GATEHOUSE_HEALTH_INTERVAL)")
	ri, err := time.ParseDuration(env("GATEHOUSE_RECLAIM_INTERVAL", "60s"))
	if err != nil {
		return nil, fmt.Errorf("GATEHOUSE_RECLAIM_INTERVAL: %w", err)
	}
	fs.DurationVar(&c.ReclaimInterval, "reclaim-interval", ri, "how often idle sandboxes are reclaimed and orphans killed (GATEHOUSE_RECLAIM_INTERVAL)")
	fl, err := time.ParseDuration(env("GATEHOUSE_FOLLOWER_LEASE", "1m"))
	if err != nil {
		return nil, fmt.Errorf("GATEHOUSE_FOLLOWER_LEASE: %w", err)
	}
	fs.DurationVar(&c.FollowerLease, "follower-lease", fl,
		"how long a recording follower's claim on a running command lasts without a write; another replica adopts the command after it (GATEHOUSE_FOLLOWER_LEASE)")
	fsi, err := time.ParseDuration(env("GATEHOUSE_FOLLOWER_SWEEP_INTERVAL", "10s"))
	if err != nil {
		return nil, fmt.Errorf("GATEHOUSE_FOLLOWER_SWEEP_INTERVAL: %w", err)
	}
	fs.DurationVar(&c.FollowerSweepInterval, "follower-sweep-interval", fsi,
		"how often running commands whose follower lease lapsed are adopted (GATEHOUSE_FOLLOWER_SWEEP_INTERVAL)")
	fs.StringVar(&c.ApprovalWebhookAllow, "approval-webhook-allow", env("GATEHOUSE_APPROVAL_WEBHOOK_ALLOW", ""),
		"private networks (comma-separated CIDR prefixes) approval webhooks may be posted to; none by default (GATEHOUSE_APPROVAL_WEBHOOK_ALLOW)")
	lw, err := strconv.Atoi(env("GATEHOUSE_LIVE_WINDOW_MIB", strconv.Itoa(DefaultLiveWindowMiB)))
	if err != nil {
		return nil, fmt.Errorf("GATEHOUSE_LIVE_WINDOW_MIB must be a whole number of MiB: %w", err)
	}
	fs.IntVar(&c.LiveWindowMiB, "live-window-mib", lw,
		"MiB of recent command output kept in memory, over every command this process records, for clients' polls; older output is read from the recording (GATEHOUSE_LIVE_WINDOW_MIB)")
	uw, err := time.ParseDuration(env("GATEHOUSE_UNREACHABLE_WINDOW", "60s"))
	if err != nil || uw <= 0 {
		return nil, fmt.Errorf("GATEHOUSE_UNREACHABLE_WINDOW must be a positive duration such as 60s")
	}
	fs.DurationVar(&c.UnreachableWindow, "unreachable-window", uw,
		"how long a session's environment may fail every call before the session is lost (GATEHOUSE_UNREACHABLE_WINDOW)")
	local, _ := strconv.ParseBool(env("GATEHOUSE_LOCAL_SANDBOXES", "false"))
	fs.BoolVar(&c.LocalSandboxes, "local-sandboxes", local,
		"start a local sandbox backend: agentd processes on this machine, NO isolation; for trying per-session sandboxes (GATEHOUSE_LOCAL_SANDBOXES)")
	fs.StringVar(&c.LocalAgentd, "local-agentd", env("GATEHOUSE_LOCAL_AGENTD", ""),
		"agentd binary the local sandbox backend runs; empty: next to the console, on PATH, or built from ./cmd/agentd (GATEHOUSE_LOCAL_AGENTD)")
	fs.StringVar(&c.AgentdDir, "agentd-dir", env("GATEHOUSE_AGENTD_DIR", ""),
		"directory of agentd release builds (agentd-linux-arm64, agentd-windows-amd64.exe, ...; scripts/release-agentd writes them) served at /downloads/agentd/ beside the console's own platform's (GATEHOUSE_AGENTD_DIR)")
	fs.StringVar(&c.MetricsListen, "metrics-listen", env("GATEHOUSE_METRICS_LISTEN", ""),
		"address to serve Prometheus /metrics on; off when empty (GATEHOUSE_METRICS_LISTEN)")
	perOrg, _ := strconv.ParseBool(env("GATEHOUSE_METRICS_PER_ORG_DB", "false"))
	fs.BoolVar(&c.MetricsPerOrgDB, "metrics-per-org-db", perOrg,
		"label per-org metrics (database pools, retention rounds) with each org's slug instead of org=\"all\" (GATEHOUSE_METRICS_PER_ORG_DB)")
	rti, err := time.ParseDuration(env("GATEHOUSE_RETENTION_INTERVAL", "1h"))
	if err != nil {
		return nil, fmt.Errorf("GATEHOUSE_RETENTION_INTERVAL: %w", err)
	}
	fs.DurationVar(&c.RetentionInterval, "retention-interval", rti,
		"how often each org's audit and recording retention is applied (GATEHOUSE_RETENTION_INTERVAL)")
	fs.StringVar(&c.E2BDomain, "e2b-domain", env("GATEHOUSE_E2B_DOMAIN", ""),
		"wildcard domain of the E2B-compatible data plane: sandboxes are reached at 49983-<id>.<domain> (GATEHOUSE_E2B_DOMAIN)")
	fs.StringVar(&c.E2BListen, "e2b-listen", env("GATEHOUSE_E2B_LISTEN", ""),
		"address to serve the E2B-compatible data plane (envd's API) on; off when empty (GATEHOUSE_E2B_LISTEN)")
	fs.StringVar(&c.E2BPublicURL, "e2b-public-url", env("GATEHOUSE_E2B_PUBLIC_URL", ""),
		"public URL of the E2B data plane for E2B_SANDBOX_URL; empty: http://<--e2b-listen>, else the console's base URL (GATEHOUSE_E2B_PUBLIC_URL)")
	lvl := env("GATEHOUSE_LOG_LEVEL", "info")
	if err := c.LogLevel.UnmarshalText([]byte(lvl)); err != nil {
		return nil, fmt.Errorf("GATEHOUSE_LOG_LEVEL must be debug, info, warn or error, not %q", lvl)
	}
	fs.TextVar(&c.LogLevel, "log-level", c.LogLevel, "lowest `level` logged: debug, info, warn or error (GATEHOUSE_LOG_LEVEL)")
	for _, cp := range []struct {
		dst       *int
		flag, env string
		def       int
		usage     string
	}{
		{&c.MaxOpenSessionsPerUser, "max-open-sessions-per-user", "GATEHOUSE_MAX_OPEN_SESSIONS_PER_USER", DefaultMaxOpenSessionsPerUser,
			"most sessions one user or service key may have open at once; 0: no cap"},
		{&c.MaxOpenSessionsPerAgent, "max-open-sessions-per-agent", "GATEHOUSE_MAX_OPEN_SESSIONS_PER_AGENT", DefaultMaxOpenSessionsPerAgent,
			"most sessions one agent may have open at once; 0: no cap"},
		{&c.MaxRunningCommandsPerUser, "max-running-commands-per-user", "GATEHOUSE_MAX_RUNNING_COMMANDS_PER_USER", DefaultMaxRunningCommandsPerUser,
			"most commands running at once in the sessions of one user or service key; 0: no cap"},
		{&c.MaxRunningCommandsPerAgent, "max-running-commands-per-agent", "GATEHOUSE_MAX_RUNNING_COMMANDS_PER_AGENT", DefaultMaxRunningCommandsPerAgent,
			"most commands running at once in the sessions of one agent; 0: no cap"},
	} {
		def, err := strconv.Atoi(env(cp.env, strconv.Itoa(cp.def)))
		if err != nil {
			return nil, fmt.Errorf("%s must be a whole number: %w", cp.env, err)
		}
		fs.IntVar(cp.dst, cp.flag, def, cp.usage+" ("+cp.env+")")
	}
	return fs, nil
}

// finish reads the secrets from the environment and checks and completes
// the parsed settings.
func (c *Config) finish(getenv func(string) string) error {
	env := func(k, def string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return def
	}
	if c.UnreachableWindow <= 0 {
		return fmt.Errorf("--unreachable-window must be a positive duration such as 60s, not %s", c.UnreachableWindow)
	}
	// Secrets come only from the environment: flag values show in ps.
	c.DatabaseURL = getenv("DATABASE_URL")
	c.MasterKey = getenv("GATEHOUSE_MASTER_KEY")
	c.AdminEmail = getenv("GATEHOUSE_ADMIN_EMAIL")
	c.AdminPassword = getenv("GATEHOUSE_ADMIN_PASSWORD")
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", c.Listen, err)
	}
	if c.BaseURL == "" {
		h := host
		if h == "" || h == "0.0.0.0" || h == "::" {
			h = "127.0.0.1"
		}
		_, port, _ := net.SplitHostPort(c.Listen)
		c.BaseURL = "http://" + net.JoinHostPort(h, port)
	}
	if err := c.finishE2B(); err != nil {
		return err
	}
	secureDefault := "true"
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		secureDefault = "false"
	}
	c.SecureCookies, _ = strconv.ParseBool(env("GATEHOUSE_SECURE_COOKIES", secureDefault))
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			return fmt.Errorf("--metrics-listen %q: %w", c.MetricsListen, err)
		}
	}
	if c.RetentionInterval <= 0 {
		return fmt.Errorf("--retention-interval must be positive")
	}
	if c.MaxOpenSessionsPerUser < 0 || c.MaxOpenSessionsPerAgent < 0 || c.MaxRunningCommandsPerUser < 0 || c.MaxRunningCommandsPerAgent < 0 {
		return fmt.Errorf("the --max-open-sessions-… and --max-running-commands-… caps cannot be negative (0 turns one off)")
	}
	if c.LiveWindowMiB < 1 || c.LiveWindowMiB > 1<<20 {
		return fmt.Errorf("--live-window-mib must be between 1 and 1048576, not %d", c.LiveWindowMiB)
	}
	c.ApprovalWebhookNets = nil
	for _, f := range strings.Split(c.ApprovalWebhookAllow, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(f)
		if err != nil {
			return fmt.Errorf("--approval-webhook-allow: %q is not a CIDR prefix such as 10.20.0.0/16", f)
		}
		c.ApprovalWebhookNets = append(c.ApprovalWebhookNets, pfx.Masked())
	}
	if c.FollowerLease < time.Second || c.FollowerSweepInterval <= 0 {
		return fmt.Errorf("--follower-lease must be at least 1s and --follower-sweep-interval positive")
	}
	if c.AgentdDir != "" {
		if fi, err := os.Stat(c.AgentdDir); err != nil || !fi.IsDir() {
			return fmt.Errorf("--agentd-dir %q must be a directory of agentd release builds (scripts/release-agentd writes one)", c.AgentdDir)
		}
	}
	// Resolved once, here: the local sandbox backend starts agentd from
	// each sandbox's own directory, where a relative path names nothing.
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return fmt.Errorf("--data-dir %q: %w", c.DataDir, err)
	}
	c.DataDir = abs
	return nil
}

// e2bDomainRE is a DNS name: labels of letters, digits and inner dashes.
var e2bDomainRE = regexp.MustCompile(`^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$`)

// finishE2B checks the E2B endpoint's settings and derives its public URL.
func (c *Config) finishE2B() error {
	c.E2BDomain = strings.ToLower(strings.TrimSuffix(c.E2BDomain, "."))
	if c.E2BDomain != "" && !e2bDomainRE.MatchString(c.E2BDomain) {
		return fmt.Errorf("--e2b-domain %q must be a domain name such as e2b.console.example (no scheme, no port)", c.E2BDomain)
	}
	if c.E2BListen != "" {
		host, port, err := net.SplitHostPort(c.E2BListen)
		if err != nil {
			return fmt.Errorf("--e2b-listen %q: %w", c.E2BListen, err)
		}
		if c.E2BPublicURL == "" {
			if host == "" || host == "0.0.0.0" || host == "::" {
				host = "127.0.0.1"
			}
			c.E2BPublicURL = "http://" + net.JoinHostPort(host, port)
		}
	}
	if c.E2BPublicURL == "" {
		c.E2BPublicURL = c.BaseURL
	}
	u, err := url.Parse(c.E2BPublicURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--e2b-public-url %q must be an http(s) URL such as https://e2b.console.example", c.E2BPublicURL)
	}
	c.E2BPublicURL = strings.TrimSuffix(c.E2BPublicURL, "/")
	return nil
}
