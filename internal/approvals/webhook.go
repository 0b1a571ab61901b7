package approvals

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/netguard"
	"github.com/gatehouse/gatehouse/internal/sealed"
)

// Webhook headers: the event and the body's signature,
// "sha256=<hex HMAC-SHA256 of the body under the org's secret>".
const (
	HeaderEvent     = "X-Gatehouse-Event"
	HeaderSignature = "X-Gatehouse-Signature"
)

// MinWebhookSecret is the shortest secret a webhook may be signed with.
const MinWebhookSecret = 16

// Sign is the signature header's value for body under secret.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// WebhookConfig is an org's webhook as shown. A webhook's URL is often a
// credential itself (a chat service's incoming-webhook path), so it is
// stored sealed and shown only as its origin: URL is scheme://host[:port]
// and PathSet says whether a path or query follows. The secret is never
// shown either, only whether one is set.
type WebhookConfig struct {
	URL       string
	PathSet   bool
	SecretSet bool
	UpdatedAt *time.Time
}

// webhookRow is the stored webhook: URL holds only the origin (what is
// shown), URLSealed the whole address, sealed like the secret.
type webhookRow struct {
	ID           int64 `gorm:"primaryKey"`
	URL          string
	PathSet      bool
	URLSealed    string
	SecretSealed string
	UpdatedAt    time.Time
}

func (webhookRow) TableName() string { return "approval_webhooks" }

func secretAD(org string) string { return sealed.AD("org:"+org, "approval_webhook_secret") }

func urlAD(org string) string { return sealed.AD("org:"+org, "approval_webhook_url") }

// origin is what may be shown of u: scheme://host[:port], and whether
// anything (path, query, fragment) followed it.
func origin(u *url.URL) (string, bool) {
	rest := strings.Trim(u.EscapedPath(), "/") != "" || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery
	return (&url.URL{Scheme: u.Scheme, Host: u.Host}).String(), rest
}

// GetWebhook reads the org's webhook (URL "" when none is set).
func (s *Service) GetWebhook(ctx context.Context) (WebhookConfig, error) {
	var rs []webhookRow
	if err := s.DB.WithContext(ctx).Limit(1).Find(&rs).Error; err != nil {
		return WebhookConfig{}, fmt.Errorf("read approval webhook: %w", err)
	}
	if len(rs) == 0 {
		return WebhookConfig{}, nil
	}
	at := rs[0].UpdatedAt.UTC()
	return WebhookConfig{URL: rs[0].URL, PathSet: rs[0].PathSet, SecretSet: rs[0].SecretSealed != "", UpdatedAt: &at}, nil
}

// SetWebhook sets (or, with an empty URL, removes) the org's webhook, its
// secret sealed under box, and audits the change (approval.webhook_update,
// never the secret) in the same transaction. The caller authorized it.
func (s *Service) SetWebhook(ctx context.Context, by audit.Actor, box *sealed.Box, rawURL, secret string) (WebhookConfig, error) {
	rawURL = strings.TrimSpace(rawURL)
	v := apperr.Validation()
	var shown string
	var pathSet bool
	if rawURL != "" {
		u, err := url.Parse(rawURL)
		if err == nil {
			shown, pathSet = origin(u)
		}
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
			v.Add("url", "The webhook URL must be an absolute http(s) address without credentials.")
		}
		if utf8.RuneCountInString(secret) < MinWebhookSecret {
			v.Add("secret", "The webhook secret must be at least %d characters.", MinWebhookSecret)
		}
	}
	if err := v.Err(); err != nil {
		return WebhookConfig{}, err
	}
	now := s.now()
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if rawURL == "" {
			if err := tx.Where("id = 1").Delete(&webhookRow{}).Error; err != nil {
				return fmt.Errorf("remove approval webhook: %w", err)
			}
		} else {
			sealedSecret, err := box.Seal([]byte(secret), secretAD(s.Org))
			if err != nil {
				return err
			}
			sealedURL, err := box.Seal([]byte(rawURL), urlAD(s.Org))
			if err != nil {
				return err
			}
			// One upsert, not a delete and an insert: two settings at once
			// must not both insert row 1 (the later one would fail).
			if err := tx.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "id"}}, UpdateAll: true}).
				Create(&webhookRow{ID: 1, URL: shown, PathSet: pathSet, URLSealed: sealedURL, SecretSealed: sealedSecret, UpdatedAt: now}).Error; err != nil {
				return fmt.Errorf("store approval webhook: %w", err)
			}
		}
		// The audit names the origin only: the path may be the credential.
		_, err := s.Audit.AppendTx(ctx, tx, audit.Event{Actor: by, Action: "approval.webhook_update", Target: audit.Target{Type: "approval_webhook", ID: "1", Name: shown},
			Details: audit.Details(map[string]any{"url": shown, "path_set": pathSet, "secret_set": rawURL != ""})})
		return err
	})
	if err != nil {
		return WebhookConfig{}, err
	}
	return s.GetWebhook(ctx)
}

// Webhook delivers new requests to each org's webhook. Delivery never
// blocks a request: the address and secret are read at once, the post
// runs on its own goroutine with Timeout, and a failure is logged and
// counted, never retried or reported to the requester.
//
// The address is chosen by an org admin, not by the operator, so the post
// reaches only what WebhookAddr allows: never the console's own machine,
// a cloud metadata service or a private network (a webhook aimed at an
// internal service would hand it the requester's command), checked on the
// address actually dialled, and no redirect is followed.
type Webhook struct {
	// Rule refuses the addresses the post may not be dialled at (a reason)
	// or allows them (""); nil is WebhookAddr. Tests posting to a loopback
	// server set a permissive one.
	Rule func(netip.Addr) string
	// Allow are private networks the operator lets webhooks reach
	// (config --approval-webhook-allow); with the default Rule they
	// override the private-network refusal only, never netguard.Blocked's.
	Allow   []netip.Prefix
	Box     *sealed.Box
	Logger  *slog.Logger
	Timeout time.Duration // 0: 10 s
	// Counted hears each delivery's result ("ok" or "error"), for metrics.
	Counted func(result string)

	once   sync.Once
	client *http.Client
}

// cgnat is the shared address space of carrier-grade NAT (RFC 6598), as
// internal to a provider's network as RFC 1918.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// WebhookAddr is the rule a webhook's post is dialled under: what
// netguard.Blocked refuses (the console's own machine, link-local and
// metadata addresses, multicast), and private networks as well (RFC 1918,
// unique local IPv6, carrier-grade NAT), in any IPv4-mapped form. A
// receiver must be reachable at a public address.
func WebhookAddr(a netip.Addr) string {
	if r := netguard.Blocked(a); r != "" {
		return r
	}
	a = a.Unmap().WithZone("")
	if a.IsPrivate() || cgnat.Contains(a) {
		return "a private network address"
	}
	return ""
}

// WebhookRule is the default rule of a Webhook with Allow: WebhookAddr,
// except that an address in one of allow, and not refused by
// netguard.Blocked, is allowed.
func WebhookRule(allow []netip.Prefix) func(netip.Addr) string {
	return func(a netip.Addr) string {
		r := WebhookAddr(a)
		if r == "" || netguard.Blocked(a) != "" {
			return r
		}
		a = a.Unmap().WithZone("")
		for _, p := range allow {
			if p.Contains(a) {
				return ""
			}
		}
		return r
	}
}

// errRedirect refuses every redirect: the signed body goes to the address
// the admin set and nowhere else.
var errRedirect = errors.New("the webhook answered with a redirect; redirects are not followed")

// httpClient is the webhook's client: its dialer refuses what Rule
// refuses, before connecting, and it follows no redirect.
func (w *Webhook) httpClient() *http.Client {
	w.once.Do(func() {
		rule := w.Rule
		if rule == nil {
			rule = WebhookRule(w.Allow)
		}
		w.client = &http.Client{Transport: netguard.Guarded(nil, rule),
			CheckRedirect: func(*http.Request, []*http.Request) error { return errRedirect }}
	})
	return w.client
}

// webhookBody is what is posted: the request as the API shows it, minus
// nothing secret (a request holds no env value to begin with).
type webhookBody struct {
	Event    string          `json:"event"`
	Org      string          `json:"org"`
	Approval webhookApproval `json:"approval"`
}

type webhookApproval struct {
	ID        int64     `json:"id"`
	State     State     `json:"state"`
	SessionID int64     `json:"session_id"`
	AgentID   int64     `json:"agent_id"`
	Command   string    `json:"command"`
	Cwd       string    `json:"cwd"`
	EnvNames  []string  `json:"env_names"`
	Rule      string    `json:"rule"`
	Requester Requester `json:"requester"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Hook returns the Requested hook of svc's org that delivers to its
// webhook.
func (w *Webhook) Hook(svc *Service) func(ctx context.Context, a Approval) {
	return func(ctx context.Context, a Approval) { w.deliver(ctx, svc, a) }
}

func (w *Webhook) deliver(ctx context.Context, svc *Service, a Approval) {
	var rs []webhookRow
	if err := svc.DB.WithContext(ctx).Limit(1).Find(&rs).Error; err != nil {
		w.failed(svc.Org, a.ID, fmt.Errorf("read the webhook: %w", err))
		return
	}
	if len(rs) == 0 {
		return
	}
	secret, err := w.Box.Open(rs[0].SecretSealed, secretAD(svc.Org))
	if err != nil {
		w.failed(svc.Org, a.ID, fmt.Errorf("open the webhook secret: %w", err))
		return
	}
	target, err := w.Box.Open(rs[0].URLSealed, urlAD(svc.Org))
	if err != nil {
		w.failed(svc.Org, a.ID, fmt.Errorf("open the webhook URL: %w", err))
		return
	}
	body, _ := json.Marshal(webhookBody{Event: "approval.requested", Org: svc.Org, Approval: webhookApproval{ID: a.ID, State: a.State,
		SessionID: a.SessionID, AgentID: a.AgentID, Command: a.Command, Cwd: a.Cwd, EnvNames: a.EnvNames, Rule: a.Rule,
		Requester: a.Requester, ExpiresAt: a.ExpiresAt}})
	sig := Sign(secret, body)
	go func() {
		timeout := w.Timeout
		if timeout <= 0 {
			timeout = 10 * time.Second
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		if err := w.post(ctx, string(target), sig, body); err != nil {
			w.failed(svc.Org, a.ID, err)
			return
		}
		w.count("ok")
	}()
}

func (w *Webhook) post(ctx context.Context, target, sig string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderEvent, "approval.requested")
	req.Header.Set(HeaderSignature, sig)
	res, err := w.httpClient().Do(req)
	if err != nil {
		return redact(err, req.URL)
	}
	defer res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return fmt.Errorf("the webhook answered %s", res.Status)
	}
	return nil
}

// redact is a failed post's error without the URL's path or query, which
// may be the webhook's credential: a *url.Error (which names the whole
// URL) becomes its operation, the origin, and the error underneath.
func redact(err error, u *url.URL) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		shown, _ := origin(u)
		return fmt.Errorf("%s %s: %w", ue.Op, shown, ue.Err)
	}
	return err
}

func (w *Webhook) failed(org string, id int64, err error) {
	// Logged before it is counted, so whoever hears the count finds the
	// log written.
	if w.Logger != nil {
		w.Logger.Warn("approval webhook failed", "org", org, "approval_id", id, "error", err)
	}
	w.count("error")
}

func (w *Webhook) count(result string) {
	if w.Counted != nil {
		w.Counted(result)
	}
}
