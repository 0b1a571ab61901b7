package sso

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/auth"
)

// StateTTL is how long a sign-in may take between leaving for the
// provider and coming back.
const StateTTL = 10 * time.Minute

// providerTTL is how long a discovery document (and the key set it
// names, which go-oidc refreshes on an unknown key id) is reused.
const providerTTL = 10 * time.Minute

// Service runs the flow. One per process: it caches each org's
// discovered provider.
type Service struct {
	// HTTP reaches the providers (discovery, keys, token endpoint).
	HTTP *http.Client
	Now  func() time.Time

	mu        sync.Mutex
	providers map[string]cachedProvider
}

type cachedProvider struct {
	p       *oidc.Provider
	fetched time.Time
}

// NewService returns a Service using client (a client with a 10 s
// timeout when nil).
func NewService(client *http.Client, now func() time.Time) *Service {
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	if now == nil {
		now = time.Now
	}
	return &Service{HTTP: client, Now: now, providers: map[string]cachedProvider{}}
}

// Forget drops an org's cached provider (its configuration changed).
func (s *Service) Forget(org string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.providers {
		if strings.HasPrefix(k, org+"\x00") {
			delete(s.providers, k)
		}
	}
}

// clientCtx carries the Service's HTTP client into go-oidc and oauth2.
func (s *Service) clientCtx(ctx context.Context) context.Context {
	return oidc.ClientContext(ctx, s.HTTP)
}

func (s *Service) provider(ctx context.Context, org, issuer string) (*oidc.Provider, error) {
	key := org + "\x00" + issuer
	s.mu.Lock()
	c, ok := s.providers[key]
	s.mu.Unlock()
	if ok && s.Now().Sub(c.fetched) < providerTTL {
		return c.p, nil
	}
	// The provider keeps this context for later key fetches: it must not
	// be the request's, which ends with the request.
	p, err := oidc.NewProvider(s.clientCtx(context.WithoutCancel(ctx)), issuer)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.providers[key] = cachedProvider{p: p, fetched: s.Now()}
	s.mu.Unlock()
	return p, nil
}

// Failure is a refused sign-in: Reason is the audited code, Message what
// the sign-in page says (what to fix), Detail the technical cause for
// the audit log. None of them ever holds the client secret.
type Failure struct {
	Reason  string
	Message string
	Detail  string
	// Email is the address the token carried, when it got that far.
	Email string
}

func (f *Failure) Error() string { return f.Reason + ": " + f.Message }

func fail(cfg Config, reason, msg string, cause error) *Failure {
	f := &Failure{Reason: reason, Message: msg}
	if cause != nil {
		f.Detail = Redact(cause.Error(), cfg.ClientSecret)
	}
	return f
}

// Redact removes secret from s: provider error messages are quoted in
// audit records and must not carry it even if a provider echoed it.
func Redact(s, secret string) string {
	if secret == "" {
		return s
	}
	return strings.ReplaceAll(s, secret, "[redacted]")
}

type stateRow struct {
	StateHash    string `gorm:"primaryKey"`
	Nonce        string
	CodeVerifier string
	IssuerURL    string
	NextPath     string
	CreatedAt    time.Time
	ExpiresAt    time.Time
}

func (stateRow) TableName() string { return "sso_states" }

// hashState is what the table keys on: a leaked table does not hand out
// usable states.
func hashState(state string) string {
	h := sha256.Sum256([]byte(state))
	return hex.EncodeToString(h[:])
}

func (s *Service) oauthConfig(p *oidc.Provider, cfg Config, redirectURL string) *oauth2.Config {
	return &oauth2.Config{ClientID: cfg.ClientID, ClientSecret: cfg.ClientSecret, Endpoint: p.Endpoint(),
		RedirectURL: redirectURL, Scopes: cfg.Scopes}
}

// Begin starts a sign-in: it discovers the provider, stores a fresh
// state with its nonce and PKCE verifier in the org's database and
// returns the provider's authorization URL and the state (which the
// caller also binds to the browser).
func (s *Service) Begin(ctx context.Context, db *gorm.DB, org string, cfg Config, redirectURL, next string) (authURL, state string, err error) {
	p, err := s.provider(ctx, org, cfg.IssuerURL)
	if err != nil {
		return "", "", unreachable(cfg, err)
	}
	state, nonce, verifier := auth.RandomToken(32), auth.RandomToken(32), oauth2.GenerateVerifier()
	now := s.Now().UTC()
	row := stateRow{StateHash: hashState(state), Nonce: nonce, CodeVerifier: verifier, IssuerURL: cfg.IssuerURL,
		NextPath: next, CreatedAt: now, ExpiresAt: now.Add(StateTTL)}
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Where("expires_at < ?", now).Delete(&stateRow{}).Error; err != nil {
			return err
		}
		return tx.Create(&row).Error
	})
	if err != nil {
		return "", "", fmt.Errorf("store sign-in state: %w", err)
	}
	authURL = s.oauthConfig(p, cfg, redirectURL).AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier))
	return authURL, state, nil
}

func unreachable(cfg Config, err error) *Failure {
	return fail(cfg, "issuer_unreachable", fmt.Sprintf("The identity provider at %s could not be reached or did not answer as an OpenID provider. "+
		"Ask an org admin to check the issuer URL (Test configuration shows what it answers).", cfg.IssuerURL), err)
}

// Callback is what the provider sent back, and the state the browser
// carried in its cookie.
type Callback struct {
	State, Code, Error, ErrorDescription string
	CookieState                          string
}

// Identity is who the provider vouched for.
type Identity struct {
	Issuer        string
	Subject       string
	Email         string
	EmailVerified *bool
	Name          string
	Groups        []string
	Next          string
}

// Finish completes a sign-in: it consumes the state (once: a replay
// finds nothing), exchanges the code with the PKCE verifier, verifies
// the ID token (signature against the provider's keys, issuer, audience,
// expiry, nonce, access-token hash) and reads the e-mail and groups. A
// *Failure says why a sign-in was refused; other errors are the
// console's own.
func (s *Service) Finish(ctx context.Context, db *gorm.DB, org string, cfg Config, redirectURL string, cb Callback) (Identity, error) {
	if cb.State == "" {
		return Identity{}, fail(cfg, "state_missing", "The provider sent you back without a sign-in state. Start the sign-in again.", nil)
	}
	row, err := consumeState(ctx, db, cb.State)
	if err != nil {
		return Identity{}, err
	}
	if row == nil {
		return Identity{}, fail(cfg, "state_unknown", "This sign-in response was already used or was never started here. Start the sign-in again.", nil)
	}
	if cb.CookieState == "" || subtle.ConstantTimeCompare([]byte(cb.CookieState), []byte(cb.State)) != 1 {
		return Identity{}, fail(cfg, "state_mismatch", "This sign-in was started in another browser or tab. Start the sign-in again here.", nil)
	}
	if !s.Now().Before(row.ExpiresAt) {
		return Identity{}, fail(cfg, "state_expired", "The sign-in took too long. Start it again.", nil)
	}
	if row.IssuerURL != cfg.IssuerURL {
		return Identity{}, fail(cfg, "config_changed", "The organization's identity provider changed during your sign-in. Start it again.", nil)
	}
	if cb.Error != "" {
		return Identity{}, fail(cfg, "provider_error", "The identity provider did not sign you in ("+cb.Error+"). Try again, or ask your identity provider's admin.",
			errors.New(cb.Error+": "+cb.ErrorDescription))
	}
	p, err := s.provider(ctx, org, cfg.IssuerURL)
	if err != nil {
		return Identity{}, unreachable(cfg, err)
	}
	tok, err := s.oauthConfig(p, cfg, redirectURL).Exchange(s.clientCtx(ctx), cb.Code, oauth2.VerifierOption(row.CodeVerifier))
	if err != nil {
		return Identity{}, exchangeFailure(cfg, err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return Identity{}, fail(cfg, "no_id_token", "The identity provider returned no ID token. Ask an org admin to check that the scopes include \"openid\".", nil)
	}
	idt, err := s.verify(ctx, p, cfg, raw)
	if err != nil {
		return Identity{}, err
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(row.Nonce)) != 1 {
		return Identity{}, fail(cfg, "wrong_nonce", "The identity provider's answer does not belong to this sign-in (nonce mismatch). Start the sign-in again.", nil)
	}
	if idt.AccessTokenHash != "" {
		if err := idt.VerifyAccessToken(tok.AccessToken); err != nil {
			return Identity{}, fail(cfg, "invalid_token", "The identity provider's tokens do not match each other. Start the sign-in again.", err)
		}
	}
	return identityFrom(cfg, idt, row.NextPath)
}

// consumeState reads and deletes a state; nil when it does not exist
// (never issued, or already used: the delete lets only one callback
// through even when two race).
func consumeState(ctx context.Context, db *gorm.DB, state string) (*stateRow, error) {
	var row stateRow
	h := hashState(state)
	res := db.WithContext(ctx).Where("state_hash = ?", h).Limit(1).Find(&row)
	if res.Error != nil {
		return nil, fmt.Errorf("read sign-in state: %w", res.Error)
	}
	if res.RowsAffected == 0 {
		return nil, nil
	}
	del := db.WithContext(ctx).Where("state_hash = ?", h).Delete(&stateRow{})
	if del.Error != nil {
		return nil, fmt.Errorf("consume sign-in state: %w", del.Error)
	}
	if del.RowsAffected != 1 {
		return nil, nil
	}
	return &row, nil
}

func exchangeFailure(cfg Config, err error) *Failure {
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) {
		return unreachable(cfg, err)
	}
	detail := fmt.Errorf("token endpoint answered %d %s: %s", re.Response.StatusCode, re.ErrorCode, re.ErrorDescription)
	switch {
	case re.ErrorCode == "invalid_client" || re.ErrorCode == "unauthorized_client" || re.Response.StatusCode == http.StatusUnauthorized:
		return fail(cfg, "client_rejected", "The identity provider refused this organization's client ID or client secret. "+
			"Ask an org admin to enter the client secret the provider issued for this client.", detail)
	case re.ErrorCode == "invalid_grant":
		return fail(cfg, "code_rejected", "The identity provider refused the sign-in code (already used, expired or for another client). Start the sign-in again.", detail)
	}
	return fail(cfg, "exchange_failed", "The identity provider did not complete the sign-in. Try again; if it keeps failing, ask an org admin to check the configuration.", detail)
}

// verify checks the ID token against the provider, classifying refusals.
func (s *Service) verify(ctx context.Context, p *oidc.Provider, cfg Config, raw string) (*oidc.IDToken, error) {
	// The issuer claim is read before the signature is checked only to
	// word the refusal: a token from another provider fails the signature
	// check too, and "wrong provider" says more than "bad signature".
	if iss := unverifiedIssuer(raw); iss != "" && iss != cfg.IssuerURL {
		return nil, fail(cfg, "wrong_issuer", "The ID token was issued by another identity provider than this organization's. Sign in through "+cfg.Label()+".",
			fmt.Errorf("token issuer %q, organization's issuer %q", iss, cfg.IssuerURL))
	}
	idt, err := p.VerifierContext(s.clientCtx(ctx), &oidc.Config{ClientID: cfg.ClientID, Now: s.Now}).Verify(ctx, raw)
	if err == nil {
		return idt, nil
	}
	var exp *oidc.TokenExpiredError
	switch msg := err.Error(); {
	case errors.As(err, &exp):
		return nil, fail(cfg, "token_expired", "The identity provider's ID token has expired (check that the console's and the provider's clocks agree). Start the sign-in again.", err)
	case strings.Contains(msg, "different provider"):
		return nil, fail(cfg, "wrong_issuer", "The ID token was issued by another identity provider than this organization's.", err)
	case strings.Contains(msg, "audience"):
		return nil, fail(cfg, "wrong_audience", "The ID token was issued to another client. Ask an org admin to check the client ID.", err)
	}
	return nil, fail(cfg, "invalid_token", "The ID token failed verification (signature or format). Start the sign-in again; if it keeps failing, ask an org admin.", err)
}

func unverifiedIssuer(raw string) string {
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var c struct {
		Iss string `json:"iss"`
	}
	_ = json.Unmarshal(b, &c)
	return c.Iss
}

func identityFrom(cfg Config, idt *oidc.IDToken, next string) (Identity, error) {
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return Identity{}, fail(cfg, "invalid_token", "The ID token's claims could not be read.", err)
	}
	id := Identity{Issuer: idt.Issuer, Subject: idt.Subject, Next: next}
	id.Email, _ = claims[cfg.EmailClaim].(string)
	id.Email = auth.NormalizeEmail(id.Email)
	if id.Email == "" || auth.ValidateEmail(id.Email) != "" {
		return id, fail(cfg, "email_missing", fmt.Sprintf("The identity provider sent no usable e-mail address in the %q claim. "+
			"Ask an org admin to check the e-mail claim and the scopes (usually \"email\").", cfg.EmailClaim), nil)
	}
	switch v := claims["email_verified"].(type) {
	case bool:
		id.EmailVerified = &v
	case string:
		b := v == "true"
		id.EmailVerified = &b
	}
	id.Name, _ = claims["name"].(string)
	switch g := claims[cfg.GroupsClaim].(type) {
	case []any:
		for _, x := range g {
			if s, ok := x.(string); ok {
				id.Groups = append(id.Groups, s)
			}
		}
	case string:
		id.Groups = strings.Fields(g)
	}
	if id.EmailVerified != nil && !*id.EmailVerified {
		f := fail(cfg, "email_unverified", "Your identity provider has not verified the e-mail address "+id.Email+". Verify it there, then sign in again.", nil)
		f.Email = id.Email
		return id, f
	}
	if !cfg.DomainAllowed(id.Email) {
		f := fail(cfg, "domain_not_allowed", fmt.Sprintf("The address %s is not in a domain allowed to sign in to this organization (%s). "+
			"Sign in with your work account, or ask an org admin to allow the domain.", id.Email, strings.Join(cfg.AllowedDomains, ", ")), nil)
		f.Email = id.Email
		return id, f
	}
	return id, nil
}
