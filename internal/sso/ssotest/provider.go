// Package ssotest runs a real OpenID Provider (zitadel/oidc's op package)
// inside a test process: discovery, JWKS, an authorization endpoint with
// PKCE, a token endpoint that authenticates the client, RS256-signed ID
// tokens, and a plain login page a browser test can fill in. Storage is
// in memory. Hooks let a test see and alter the ID token on its way out
// of the token endpoint (tampering, substitution) without ever minting a
// token by hand.
package ssotest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// User is an account at the provider.
type User struct {
	Subject       string
	Username      string
	Password      string
	Email         string
	EmailVerified bool
	Name          string
	Groups        []string
}

// Options configure one provider with one client.
type Options struct {
	ClientID     string
	ClientSecret string
	// RedirectURIs the client may use (exact match).
	RedirectURIs []string
	Users        []User
	// IDTokenLifetime defaults to an hour; a negative one issues tokens
	// that are already expired.
	IDTokenLifetime time.Duration
}

// Provider is a running OpenID Provider.
type Provider struct {
	URL string // the issuer

	srv   *httptest.Server
	store *storage

	mu      sync.Mutex
	tamper  func(idToken string) string
	lastIDs []string
}

// Start runs a provider until the test ends.
func Start(t testing.TB, o Options) *Provider {
	t.Helper()
	if o.IDTokenLifetime == 0 {
		o.IDTokenLifetime = time.Hour
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatalf("provider key: %v", err)
	}
	st := &storage{opts: o, key: key, kid: randomID(), requests: map[string]*authRequest{}, codes: map[string]string{}, tokens: map[string]string{}}
	p := &Provider{store: st}
	mux := http.NewServeMux()
	p.srv = httptest.NewUnstartedServer(mux)
	p.URL = "http://" + p.srv.Listener.Addr().String()
	st.issuer = p.URL
	var crypto [32]byte
	_, _ = rand.Read(crypto[:])
	provider, err := op.NewProvider(&op.Config{CryptoKey: crypto, CodeMethodS256: true, AuthMethodPost: true},
		st, op.StaticIssuer(p.URL), op.WithAllowInsecure())
	if err != nil {
		t.Fatalf("start provider: %v", err)
	}
	mux.HandleFunc("/login", p.login)
	mux.Handle("/oauth/token", p.watchTokens(provider))
	mux.Handle("/", provider)
	p.srv.Start()
	t.Cleanup(p.srv.Close)
	return p
}

// Close stops the provider (an unreachable issuer).
func (p *Provider) Close() { p.srv.Close() }

// Tamper replaces every ID token the token endpoint returns with
// f(token); nil stops tampering.
func (p *Provider) Tamper(f func(idToken string) string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tamper = f
}

// IDTokens are the ID tokens the token endpoint issued, as issued.
func (p *Provider) IDTokens() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lastIDs...)
}

// SetIDTokenLifetime changes how long new ID tokens live; a negative
// lifetime issues tokens that are already expired.
func (p *Provider) SetIDTokenLifetime(d time.Duration) {
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	p.store.opts.IDTokenLifetime = d
}

// SetGroups changes a user's groups (as an IdP admin would).
func (p *Provider) SetGroups(username string, groups []string) {
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	for i := range p.store.opts.Users {
		if p.store.opts.Users[i].Username == username {
			p.store.opts.Users[i].Groups = groups
		}
	}
}

// watchTokens records the ID tokens the token endpoint issues and applies
// the tamper hook.
func (p *Provider) watchTokens(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		var m map[string]any
		if rec.Code == http.StatusOK && json.Unmarshal(body, &m) == nil {
			if id, ok := m["id_token"].(string); ok {
				p.mu.Lock()
				p.lastIDs = append(p.lastIDs, id)
				f := p.tamper
				p.mu.Unlock()
				if f != nil {
					m["id_token"] = f(id)
					body, _ = json.Marshal(m)
				}
			}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(rec.Code)
		_, _ = w.Write(body)
	})
}

var loginPage = template.Must(template.New("login").Parse(`<!doctype html>
<html><head><title>Test IdP sign-in</title></head><body>
<h1 data-testid="idp-heading">Test identity provider</h1>
{{if .Error}}<p data-testid="idp-error">{{.Error}}</p>{{end}}
<form method="post" action="/login">
<input type="hidden" name="id" value="{{.ID}}">
<label>Username <input id="idp-username" name="username"></label>
<label>Password <input id="idp-password" name="password" type="password"></label>
<button type="submit" data-testid="idp-submit">Sign in</button>
</form></body></html>`))

// login is the provider's own sign-in page.
func (p *Provider) login(w http.ResponseWriter, r *http.Request) {
	id := r.FormValue("id")
	if r.Method == http.MethodGet {
		_ = loginPage.Execute(w, map[string]string{"ID": id})
		return
	}
	sub, ok := p.store.check(r.FormValue("username"), r.FormValue("password"))
	if !ok || !p.store.authenticate(id, sub) {
		w.WriteHeader(http.StatusUnauthorized)
		_ = loginPage.Execute(w, map[string]string{"ID": id, "Error": "Wrong username or password."})
		return
	}
	http.Redirect(w, r, p.URL+"/authorize/callback?id="+id, http.StatusFound)
}

// LoginURL is where a client's browser is sent to sign in.
func (s *storage) loginURL(id string) string { return s.issuer + "/login?id=" + id }

// storage is the provider's in-memory state.
type storage struct {
	opts   Options
	issuer string
	key    *rsa.PrivateKey
	kid    string

	mu       sync.Mutex
	requests map[string]*authRequest
	codes    map[string]string // code → request id
	tokens   map[string]string // access token id → subject
}

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

func (s *storage) check(username, password string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range s.opts.Users {
		if u.Username == username && u.Password == password {
			return u.Subject, true
		}
	}
	return "", false
}

func (s *storage) user(sub string) (User, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range s.opts.Users {
		if u.Subject == sub {
			return u, true
		}
	}
	return User{}, false
}

func (s *storage) authenticate(id, sub string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ar, ok := s.requests[id]
	if !ok {
		return false
	}
	ar.subject, ar.done, ar.authTime = sub, true, time.Now()
	return true
}

var errNotFound = errors.New("not found")

func (s *storage) CreateAuthRequest(_ context.Context, req *oidc.AuthRequest, userID string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ar := &authRequest{id: randomID(), req: *req, subject: userID}
	s.requests[ar.id] = ar
	return ar, nil
}

func (s *storage) AuthRequestByID(_ context.Context, id string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ar, ok := s.requests[id]; ok {
		return ar, nil
	}
	return nil, errNotFound
}

func (s *storage) AuthRequestByCode(_ context.Context, code string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ar, ok := s.requests[s.codes[code]]; ok {
		return ar, nil
	}
	return nil, errNotFound
}

func (s *storage) SaveAuthCode(_ context.Context, id, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.codes[code] = id
	return nil
}

func (s *storage) DeleteAuthRequest(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.requests, id)
	for c, rid := range s.codes {
		if rid == id {
			delete(s.codes, c)
		}
	}
	return nil
}

func (s *storage) CreateAccessToken(_ context.Context, req op.TokenRequest) (string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := randomID()
	s.tokens[id] = req.GetSubject()
	return id, time.Now().Add(5 * time.Minute), nil
}

func (s *storage) CreateAccessAndRefreshTokens(context.Context, op.TokenRequest, string) (string, string, time.Time, error) {
	return "", "", time.Time{}, errors.New("refresh tokens are not supported")
}

func (s *storage) TokenRequestByRefreshToken(context.Context, string) (op.RefreshTokenRequest, error) {
	return nil, op.ErrInvalidRefreshToken
}

func (s *storage) TerminateSession(context.Context, string, string) error { return nil }

func (s *storage) RevokeToken(context.Context, string, string, string) *oidc.Error { return nil }

func (s *storage) GetRefreshTokenInfo(context.Context, string, string) (string, string, error) {
	return "", "", op.ErrInvalidRefreshToken
}

type signingKey struct {
	kid string
	key *rsa.PrivateKey
}

func (k signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k signingKey) Key() any                                    { return k.key }
func (k signingKey) ID() string                                  { return k.kid }

type publicKey struct{ signingKey }

func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return &k.key.PublicKey }

func (s *storage) SigningKey(context.Context) (op.SigningKey, error) {
	return signingKey{kid: s.kid, key: s.key}, nil
}

func (s *storage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *storage) KeySet(context.Context) ([]op.Key, error) {
	return []op.Key{publicKey{signingKey{kid: s.kid, key: s.key}}}, nil
}

func (s *storage) GetClientByClientID(_ context.Context, id string) (op.Client, error) {
	if id != s.opts.ClientID {
		return nil, errNotFound
	}
	return client{s: s}, nil
}

func (s *storage) AuthorizeClientIDSecret(_ context.Context, id, secret string) error {
	if id != s.opts.ClientID || secret != s.opts.ClientSecret {
		return errors.New("wrong client id or secret")
	}
	return nil
}

func (s *storage) SetUserinfoFromScopes(context.Context, *oidc.UserInfo, string, string, []string) error {
	return nil
}

// SetUserinfoFromRequest puts the user's claims into the ID token.
func (s *storage) SetUserinfoFromRequest(_ context.Context, info *oidc.UserInfo, req op.IDTokenRequest, scopes []string) error {
	return s.setUserinfo(info, req.GetSubject(), scopes)
}

func (s *storage) setUserinfo(info *oidc.UserInfo, sub string, scopes []string) error {
	u, ok := s.user(sub)
	if !ok {
		return errNotFound
	}
	info.Subject = u.Subject
	for _, sc := range scopes {
		switch sc {
		case oidc.ScopeEmail:
			info.Email, info.EmailVerified = u.Email, oidc.Bool(u.EmailVerified)
		case oidc.ScopeProfile:
			info.Name, info.PreferredUsername = u.Name, u.Username
		}
	}
	info.AppendClaims("groups", u.Groups)
	return nil
}

func (s *storage) SetUserinfoFromToken(_ context.Context, info *oidc.UserInfo, tokenID, _, _ string) error {
	s.mu.Lock()
	sub, ok := s.tokens[tokenID]
	s.mu.Unlock()
	if !ok {
		return errNotFound
	}
	return s.setUserinfo(info, sub, []string{oidc.ScopeEmail, oidc.ScopeProfile})
}

func (s *storage) SetIntrospectionFromToken(context.Context, *oidc.IntrospectionResponse, string, string, string) error {
	return errors.New("introspection is not supported")
}

func (s *storage) GetPrivateClaimsFromScopes(context.Context, string, string, []string) (map[string]any, error) {
	return nil, nil
}

func (s *storage) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, errNotFound
}

func (s *storage) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errors.New("JWT profile is not supported")
}

func (s *storage) Health(context.Context) error { return nil }

// authRequest is one authorization request and who signed in for it.
type authRequest struct {
	id       string
	req      oidc.AuthRequest
	subject  string
	done     bool
	authTime time.Time
}

func (a *authRequest) GetID() string                      { return a.id }
func (a *authRequest) GetACR() string                     { return "" }
func (a *authRequest) GetAMR() []string                   { return []string{"pwd"} }
func (a *authRequest) GetAudience() []string              { return []string{a.req.ClientID} }
func (a *authRequest) GetAuthTime() time.Time             { return a.authTime }
func (a *authRequest) GetClientID() string                { return a.req.ClientID }
func (a *authRequest) GetNonce() string                   { return a.req.Nonce }
func (a *authRequest) GetRedirectURI() string             { return a.req.RedirectURI }
func (a *authRequest) GetScopes() []string                { return a.req.Scopes }
func (a *authRequest) GetState() string                   { return a.req.State }
func (a *authRequest) GetSubject() string                 { return a.subject }
func (a *authRequest) Done() bool                         { return a.done }
func (a *authRequest) GetResponseType() oidc.ResponseType { return a.req.ResponseType }
func (a *authRequest) GetResponseMode() oidc.ResponseMode { return a.req.ResponseMode }
func (a *authRequest) GetCodeChallenge() *oidc.CodeChallenge {
	if a.req.CodeChallenge == "" {
		return nil
	}
	return &oidc.CodeChallenge{Challenge: a.req.CodeChallenge, Method: a.req.CodeChallengeMethod}
}

// client is the one registered client.
type client struct{ s *storage }

func (c client) GetID() string                       { return c.s.opts.ClientID }
func (c client) RedirectURIs() []string              { return c.s.opts.RedirectURIs }
func (c client) PostLogoutRedirectURIs() []string    { return nil }
func (c client) ApplicationType() op.ApplicationType { return op.ApplicationTypeWeb }
func (c client) AuthMethod() oidc.AuthMethod         { return oidc.AuthMethodBasic }
func (c client) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c client) GrantTypes() []oidc.GrantType        { return []oidc.GrantType{oidc.GrantTypeCode} }
func (c client) LoginURL(id string) string           { return c.s.loginURL(id) }
func (c client) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeBearer }
func (c client) IDTokenLifetime() time.Duration {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.opts.IDTokenLifetime
}
func (c client) DevMode() bool                        { return true }
func (c client) IsScopeAllowed(string) bool           { return true }
func (c client) IDTokenUserinfoClaimsAssertion() bool { return true }
func (c client) ClockSkew() time.Duration             { return 0 }
func (c client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}

// FlipSignature returns tok with one bit of its signature changed: the
// same header and claims, a signature that no longer verifies.
func FlipSignature(tok string) string {
	i := strings.LastIndex(tok, ".")
	if i < 0 || i+2 >= len(tok) {
		return tok
	}
	sig := []byte(tok[i+1:])
	c := sig[len(sig)/2]
	sig[len(sig)/2] = map[bool]byte{true: 'B', false: 'A'}[c == 'A']
	return tok[:i+1] + string(bytes.Clone(sig))
}
