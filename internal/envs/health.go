package envs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/clip"
	"github.com/gatehouse/gatehouse/internal/netguard"
	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/store"
)

// SlowThreshold marks a reachable but slow environment degraded.
const SlowThreshold = 2 * time.Second

// Check probes one environment: a host's agentd /healthz, or a sandbox
// backend's health and template list (which also refreshes the registered
// templates' status).
func (s *Service) Check(ctx context.Context, e Environment, timeout time.Duration) Health {
	hc, reserved := s.probeClient(e)
	h := s.check(ctx, e, hc, timeout)
	h.OwnMachine = reserved.Load()
	return h
}

// OwnMachineError is all a failed probe tells about an address on the
// console's own machine, a link-local or a metadata address, to whoever
// lacks org-wide authority over environments.
const OwnMachineError = "No agentd or backend answered properly there. The address is on the console's own machine (or link-local), so no detail is shown; an org admin's \"Test connection\" shows it."

// Shown is h as stored and as shown to those without org-wide authority:
// when the probe dialled the console's own machine (or a link-local or
// metadata address) and nothing there proved to be agentd or a backend,
// the error no longer tells a closed port from an open one. Whoever may
// add shared environments could otherwise scan that machine with them.
func (h Health) Shown() Health {
	if h.OwnMachine && !h.answered {
		h.Error = OwnMachineError
	}
	return h
}

// probeClient is the client of one probe. For a shared environment it
// refuses what netguard.Metadata refuses whatever transport the service
// was given (a probe is what a department owner triggers at will), and
// notes whether any address dialled is one netguard reserves for the
// console's own machine (a private environment is refused those outright
// by clientFor).
func (s *Service) probeClient(e Environment) (*http.Client, *atomic.Bool) {
	c := s.clientFor(e)
	var reserved atomic.Bool
	if !e.Private() {
		// Built on the service's own transport, not clientFor's
		// sharedTransport: with none given, Watched hooks a plain dialer
		// and notes the address before connecting, so a closed port on
		// the console's machine is noted like an open one.
		var base http.RoundTripper
		if s.HTTPClient != nil {
			base = s.HTTPClient.Transport
		}
		c.Transport = netguard.Watched(base, netguard.Metadata, func(a netip.Addr) {
			if netguard.Blocked(a) != "" {
				reserved.Store(true)
			}
		})
	}
	return c, &reserved
}

func (s *Service) check(ctx context.Context, e Environment, hc *http.Client, timeout time.Duration) Health {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	h := Health{Status: HealthHealthy}
	switch e.Kind {
	case KindHost:
		c, err := s.agentdOver(e, hc)
		if err != nil {
			return Health{Status: HealthUnreachable, Error: err.Error()}
		}
		hz, err := c.Health(ctx)
		h.Latency = time.Since(start)
		if err != nil {
			return Health{Status: HealthUnreachable, Error: explain(err), Latency: h.Latency}
		}
		h.Version, h.ActiveSessions, h.answered = hz.Version, hz.ActiveSessions, true
		h.ExecReporting, h.ExecReportingReason = hz.ExecReporting, hz.ExecReportingReason
		if hz.Status != "ok" {
			h.Status, h.Error = HealthDegraded, fmt.Sprintf("agentd reports status %q", hz.Status)
			break
		}
		// /healthz needs no token; prove the stored one works with the
		// cheapest authenticated call, or every command would fail later.
		if _, err := c.Stat(ctx, "."); errors.Is(err, agentd.ErrUnauthorized) {
			h.Status, h.Error = HealthDegraded, "agentd refuses the stored token: replace the agentd token"
		} else if err != nil && agentd.Unanswered(err) {
			// It went away between the two calls: as unreachable as if
			// /healthz had gone unanswered.
			return Health{Status: HealthUnreachable, Error: explain(err), Latency: time.Since(start)}
		} else if err != nil && !isFileError(err) {
			h.Status, h.Error = HealthDegraded, "agentd answered /healthz but not an authenticated call: "+scrub(err.Error())
		}
		h.Latency = time.Since(start)
	case KindSandbox:
		b, err := s.backendOver(e, hc)
		if err != nil {
			return Health{Status: HealthUnreachable, Error: err.Error()}
		}
		if err := b.Health(ctx); err != nil {
			// Reachable but refusing the key: every sandbox call would
			// fail, so name the secret to fix.
			if errors.Is(err, sandbox.ErrUnauthorized) {
				return Health{Status: HealthDegraded, Latency: time.Since(start),
					Error: "the backend is up but refuses the stored API key (its authenticated template list failed): replace the API key"}
			}
			return Health{Status: HealthUnreachable, Error: explain(err), Latency: time.Since(start)}
		}
		ts, err := b.ListTemplates(ctx)
		h.Latency = time.Since(start)
		if err != nil {
			return Health{Status: HealthDegraded, Error: "the backend is up but its template list failed: " + scrub(err.Error()), Latency: h.Latency}
		}
		h.answered = true
		missing, err := s.syncTemplateStatus(ctx, e.ID, ts)
		if err != nil {
			return Health{Status: HealthDegraded, Error: "could not record template status: " + err.Error(), Latency: h.Latency}
		}
		if len(missing) > 0 {
			h.Status, h.Error = HealthDegraded, "registered templates missing at the backend: "+strings.Join(missing, ", ")
		} else if strings.HasPrefix(e.HealthError, StartFailedPrefix) {
			// Answering is not starting: it stays degraded for the
			// failed start until a sandbox starts (ClearStartFailure).
			h.Status, h.Error = HealthDegraded, e.HealthError
		}
	}
	if h.Status == HealthHealthy && h.Latency > SlowThreshold {
		h.Status, h.Error = HealthDegraded, fmt.Sprintf("answered in %s (over %s)", h.Latency.Round(time.Millisecond), SlowThreshold)
	}
	return h
}

// isFileError reports answers that still prove the token was accepted.
func isFileError(err error) bool {
	return errors.Is(err, agentd.ErrNotFound) || errors.Is(err, agentd.ErrPathOutsideRoot) || errors.Is(err, agentd.ErrBadRequest)
}

// explain turns a failed probe into what an admin can act on, keeping the
// underlying error as detail.
func explain(err error) string {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	hint := ""
	switch {
	case errors.Is(err, context.DeadlineExceeded) || os.IsTimeout(err):
		hint = "No answer in time: is the host up, and does a firewall let the console reach it?"
	case errors.As(err, &dnsErr):
		hint = "The host name does not resolve."
	case errors.Is(err, syscall.ECONNREFUSED):
		hint = "Connection refused: is agentd (or the backend) running and listening on that port?"
	case errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH):
		hint = "No route to the host."
	case errors.As(err, &opErr) && opErr.Op == "remote error":
		hint = "The TLS handshake failed: check the scheme and the certificate."
	case strings.Contains(err.Error(), "x509:") || strings.Contains(err.Error(), "tls:"):
		hint = "The TLS handshake failed: check the scheme and the certificate."
	}
	if hint == "" {
		return scrub(err.Error())
	}
	return hint + " (" + scrub(err.Error()) + ")"
}

// scrub keeps an error message to one line; URLs carry no credentials
// (validation refuses them) and tokens travel only in headers.
func scrub(msg string) string {
	msg = strings.ReplaceAll(msg, "\n", " ")
	return clip.String(msg, 300)
}

// CheckAndRecord probes e, stores the result (as Shown) and audits a
// status change as the system. It returns the new health in full; callers
// show it through Shown unless the viewer has org-wide authority.
func (s *Service) CheckAndRecord(ctx context.Context, e Environment, log *audit.Log, timeout time.Duration) (Health, error) {
	full := s.Check(ctx, e, timeout)
	// What is stored is shown to everyone who sees the environment.
	return full, s.recordAudited(ctx, e, log, full.Shown(), "health-checker")
}

// StartFailedPrefix begins the health error of a sandbox environment whose
// backend failed to start a sandbox for a session. A backend can answer
// its health and template calls and still fail every create (the local
// backend could not run agentd): until a sandbox starts there again, its
// probes leave it degraded with this reason rather than call it healthy.
const StartFailedPrefix = "The backend could not start a sandbox: "

// RecordStartFailure marks sandbox environment e degraded because its
// backend failed to start a sandbox (cause says how), audited as a health
// change by the system.
func (s *Service) RecordStartFailure(ctx context.Context, e Environment, log *audit.Log, cause string) error {
	return s.recordAudited(ctx, e, log, Health{Status: HealthDegraded, Error: StartFailedPrefix + scrub(cause)}, "sandbox-lifecycle")
}

// ClearStartFailure marks e healthy again once a sandbox started there,
// when a start failure is what it was degraded for.
func (s *Service) ClearStartFailure(ctx context.Context, e Environment, log *audit.Log) error {
	// Read as stored: the caller's copy may come from a cache.
	e, err := s.load(ctx, e.ID)
	if err != nil || !strings.HasPrefix(e.HealthError, StartFailedPrefix) {
		return err
	}
	return s.recordAudited(ctx, e, log, Health{Status: HealthHealthy}, "sandbox-lifecycle")
}

// recordAudited stores h as e's health and audits a status change as the
// system actor named by, in one transaction.
func (s *Service) recordAudited(ctx context.Context, e Environment, log *audit.Log, h Health, by string) error {
	// Record it and its audit event together.
	return s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		in := *s
		in.DB = tx
		prev, err := in.RecordHealth(ctx, e.ID, h)
		if err != nil || prev == "" || log == nil {
			return err
		}
		_, err = log.AppendTx(ctx, tx, audit.Event{
			Actor:  audit.Actor{Type: audit.ActorSystem, Name: by},
			Action: "environment.health_change",
			Target: audit.Target{Type: "environment", ID: fmt.Sprint(e.ID), Name: e.Name},
			Details: audit.Details(map[string]any{"before": map[string]any{"status": prev},
				"after": map[string]any{"status": h.Status, "error": h.Error}}),
		})
		return err
	})
}

// OrgDeps is what the checker needs of one org while checking it.
type OrgDeps struct {
	Envs    *Service
	Audit   *audit.Log
	Release func()
}

// Checker polls every environment of every active org. With several
// console replicas on Postgres, an advisory lock per org database lets one
// replica check an org per round; the others skip it. Every decision is
// idempotent, so a lost lock costs at most a duplicate probe.
type Checker struct {
	ListOrgs func(ctx context.Context) ([]string, error)
	OpenOrg  func(ctx context.Context, slug string) (OrgDeps, error)
	Interval time.Duration
	Timeout  time.Duration
	// Parallel bounds concurrent probes per org.
	Parallel int
	Logger   *slog.Logger
	// Observe, when set, hears each probe's environment kind, status and
	// latency (metrics).
	Observe func(kind, status string, latency time.Duration)
}

// Run checks every Interval until ctx ends.
func (c *Checker) Run(ctx context.Context) {
	if c.Interval <= 0 {
		c.Interval = 30 * time.Second
	}
	t := time.NewTicker(c.Interval)
	defer t.Stop()
	for {
		c.Round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Round checks every org once. Without the catalog the round is skipped
// and says so; an org whose database is down is skipped alone. Nothing is
// decided from a partial read.
func (c *Checker) Round(ctx context.Context) {
	slugs, err := c.ListOrgs(ctx)
	if err != nil {
		if store.IsUnavailable(err) {
			c.logger().Warn("health check: round skipped, database unavailable", "database", "catalog", "error", err)
			return
		}
		c.logger().Warn("health check: list orgs", "error", err)
		return
	}
	for _, slug := range slugs {
		if ctx.Err() != nil {
			return
		}
		if err := c.CheckOrg(ctx, slug); err != nil {
			if store.IsUnavailable(err) {
				c.logger().Warn("health check: org skipped this round, database unavailable", "org", slug, "database", "org "+slug, "error", err)
				continue
			}
			c.logger().Warn("health check failed", "org", slug, "error", err)
		}
	}
}

func (c *Checker) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

// healthLockKey derives the per-org advisory lock key.
func healthLockKey(slug string) int64 { return store.LockKey("gatehouse-health:" + slug) }

// CheckOrg checks one org's environments, unless another replica holds the
// org's lock.
func (c *Checker) CheckOrg(ctx context.Context, slug string) error {
	deps, err := c.OpenOrg(ctx, slug)
	if err != nil {
		return err
	}
	defer deps.Release()
	unlock, ok, err := store.TryAdvisoryLock(ctx, deps.Envs.DB, healthLockKey(slug))
	if err != nil || !ok {
		return err
	}
	defer unlock()
	list, err := deps.Envs.listAll(ctx)
	if err != nil {
		return err
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	par := c.Parallel
	if par <= 0 {
		par = 8
	}
	// Losing the database mid-round stops the round: further probes could
	// not be recorded, and half a round must not pass for a whole one.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for _, e := range list {
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(e Environment) {
			defer wg.Done()
			defer func() { <-sem }()
			h, err := deps.Envs.CheckAndRecord(ctx, e, deps.Audit, timeout)
			if c.Observe != nil {
				c.Observe(e.Kind, h.Status, h.Latency)
			}
			if err != nil {
				if store.IsUnavailable(err) {
					cancel(err)
					return
				}
				c.logger().Warn("record health", "org", slug, "environment", e.ID, "error", err)
			}
		}(e)
	}
	wg.Wait()
	if cause := context.Cause(ctx); store.IsUnavailable(cause) {
		return cause
	}
	return nil
}
