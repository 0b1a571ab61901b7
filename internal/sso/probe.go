package sso

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/coreos/go-oidc/v3/oidc"
)

// maxJWKS bounds the key set read by a probe.
const maxJWKS = 1 << 20

// Key is one key of the provider's key set.
type Key struct {
	ID        string `json:"kid"`
	Type      string `json:"kty"`
	Algorithm string `json:"alg,omitempty"`
	Use       string `json:"use,omitempty"`
}

// Report is what Test configuration found.
type Report struct {
	OK                    bool     `json:"ok"`
	Issuer                string   `json:"issuer"`
	AuthorizationEndpoint string   `json:"authorization_endpoint,omitempty"`
	TokenEndpoint         string   `json:"token_endpoint,omitempty"`
	JWKSURI               string   `json:"jwks_uri,omitempty"`
	SigningAlgorithms     []string `json:"signing_algorithms,omitempty"`
	Scopes                []string `json:"scopes_supported,omitempty"`
	PKCEMethods           []string `json:"pkce_methods,omitempty"`
	Keys                  []Key    `json:"keys"`
	Problems              []string `json:"problems"`
}

// Probe fetches the discovery document and the key set of cfg's issuer
// afresh and reports what they hold. It cannot check the client secret:
// only a sign-in does.
func (s *Service) Probe(ctx context.Context, cfg Config) Report {
	r := Report{Issuer: cfg.IssuerURL, Keys: []Key{}, Problems: []string{}}
	p, err := oidc.NewProvider(s.clientCtx(ctx), cfg.IssuerURL)
	if err != nil {
		r.Problems = append(r.Problems, "Discovery failed: "+Redact(err.Error(), cfg.ClientSecret))
		return r
	}
	var d struct {
		Auth    string   `json:"authorization_endpoint"`
		Token   string   `json:"token_endpoint"`
		JWKS    string   `json:"jwks_uri"`
		Algs    []string `json:"id_token_signing_alg_values_supported"`
		Scopes  []string `json:"scopes_supported"`
		Methods []string `json:"code_challenge_methods_supported"`
	}
	if err := p.Claims(&d); err != nil {
		r.Problems = append(r.Problems, "The discovery document could not be read: "+err.Error())
		return r
	}
	r.AuthorizationEndpoint, r.TokenEndpoint, r.JWKSURI = d.Auth, d.Token, d.JWKS
	r.SigningAlgorithms, r.Scopes, r.PKCEMethods = d.Algs, d.Scopes, d.Methods
	if d.Token == "" {
		r.Problems = append(r.Problems, "The discovery document names no token endpoint.")
	}
	if len(d.Methods) > 0 && !slices.Contains(d.Methods, "S256") {
		r.Problems = append(r.Problems, "The provider does not list PKCE method S256; sign-in uses it.")
	}
	keys, err := s.fetchKeys(ctx, d.JWKS)
	if err != nil {
		r.Problems = append(r.Problems, "The key set could not be fetched: "+err.Error())
	} else {
		r.Keys = append(r.Keys, keys...) // never null in the answer, even for a set without "keys"
		if len(keys) == 0 {
			r.Problems = append(r.Problems, "The key set holds no keys: no ID token could be verified.")
		}
	}
	for _, sc := range cfg.Scopes {
		if len(d.Scopes) > 0 && !slices.Contains(d.Scopes, sc) {
			r.Problems = append(r.Problems, fmt.Sprintf("The provider does not list the scope %q.", sc))
		}
	}
	r.OK = len(r.Problems) == 0
	return r
}

func (s *Service) fetchKeys(ctx context.Context, uri string) ([]Key, error) {
	if uri == "" {
		return nil, fmt.Errorf("the discovery document names no jwks_uri")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, uri, nil)
	if err != nil {
		return nil, err
	}
	res, err := s.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", uri, res.Status)
	}
	var set struct {
		Keys []Key `json:"keys"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, maxJWKS)).Decode(&set); err != nil {
		return nil, fmt.Errorf("%s is not a JSON key set: %w", uri, err)
	}
	if set.Keys == nil {
		set.Keys = []Key{}
	}
	return set.Keys, nil
}
