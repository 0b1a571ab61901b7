package console

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/google/uuid"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/gateway"
	"github.com/gatehouse/gatehouse/internal/netguard"
	"github.com/gatehouse/gatehouse/internal/recorder"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/tenant"
)

// agentdHTTP is the client the gateway and its followers reach agentd
// with: connections are kept and reused (one command is several calls),
// redirects are never followed, so the injected token goes nowhere else,
// and no connection is made to a link-local or cloud metadata address
// (netguard.Metadata, the rule for every environment; envs.ClientFor keeps
// this transport for shared environments and adds the stricter rule for
// private ones).
func agentdHTTP() *http.Client { return agentdClient(netguard.Metadata) }

// agentdClient is a kept-alive client whose dialer refuses, before
// connecting, every address rule refuses: netguard.Metadata for shared
// environments, netguard.Blocked (the console's own machine too) for
// private ones.
func agentdClient(rule func(netip.Addr) string) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext: (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second,
				Control: netguard.ControlFor(rule)}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: 10 * time.Second,
			ForceAttemptHTTP2:   true,
		},
		CheckRedirect: func(req *http.Request, _ []*http.Request) error {
			return errors.New("agentd redirected to " + req.URL.Redacted() + "; redirects are not followed")
		},
	}
}

// newGateway builds the terminal gateway and its recording followers.
func (c *Console) newGateway() *gateway.Gateway {
	hc := agentdHTTP()
	f := &recorder.Followers{
		Owner:    "console-" + uuid.NewString(),
		ListOrgs: c.activeOrgs,
		OpenOrg:  c.followerOrg,
		HTTP:     hc,
		Lease:    c.Config.FollowerLease,
		// The window of recent output clients' polls are answered from,
		// over every command followed here.
		LiveBudget: int64(c.Config.LiveWindowMiB) << 20,
		Logger:     c.Logger,
		// Private environments get a dialer that checks before it
		// connects: no handshake reaches the console's own machine.
		Clients: envs.AgentdClients{Private: agentdClient(netguard.Blocked)},
	}
	return &gateway.Gateway{HTTP: hc, Followers: f, Logger: c.Logger}
}

// followerOrg opens an org for a recording follower, acting as the system.
func (c *Console) followerOrg(ctx context.Context, slug string) (recorder.Org, func(), error) {
	t, err := c.Tenants.Open(ctx, slug)
	if err != nil {
		return recorder.Org{}, nil, err
	}
	return recorder.Org{Slug: slug, DB: t.DB, Audit: t.Audit, Sessions: c.orgSessions(t, slug), Revoked: t.Context()}, t.Release, nil
}

// orgSessions is org slug's sessions service over its open tenant t,
// acting as the system: the reclaimer and the recording followers use it.
func (c *Console) orgSessions(t *tenant.Tenant, slug string) *sessions.Service {
	es := &envs.Service{DB: t.DB, Box: c.Box, Org: slug}
	return &sessions.Service{DB: t.DB, Pool: t.DB, Envs: es, Agents: &agents.Service{DB: t.DB, Envs: es}, Org: slug, Audit: t.Audit, RT: c.SessionsRT}
}

// ApprovalQueue is org t's approval queue as the gateway should use it: on
// the org's database and audit log, sharing this process's notifier with
// the console's handlers, so a decision made on this replica releases a
// waiting exec at once (and one made on another replica within
// approvals.DefaultPollEvery); each new request is posted to the org's
// webhook, if it has one.
func (c *Console) ApprovalQueue(t *tenant.Tenant) *approvals.Service {
	svc := &approvals.Service{DB: t.DB, Audit: t.Audit, Org: t.Org.Slug, Notifier: c.Approvals}
	if c.ApprovalWebhook != nil {
		svc.Requested = c.ApprovalWebhook.Hook(svc)
	}
	return svc
}
