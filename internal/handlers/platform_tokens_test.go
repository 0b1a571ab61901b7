package handlers_test

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestPlatformTokensRejected crafts tokens that must never authenticate.
// Each is built from a real, live session so that the one thing wrong with
// it is the reason it is refused.
func TestPlatformTokensRejected(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	good := e.adminToken()
	wantStatus(t, "the genuine token", e.json(http.MethodGet, "/api/v1/orgs", good, nil), http.StatusOK)

	var claims auth.Claims
	parsed, _, err := jwt.NewParser().ParseUnverified(good, &claims)
	if err != nil {
		t.Fatal(err)
	}
	kid, _ := parsed.Header["kid"].(string)
	if kid == "" {
		t.Fatal("issued token has no kid")
	}
	// The catalog's real signing key, as the console loaded it.
	realKID, realKey, err := auth.LoadOrCreateSigningKey(t.Context(), e.c.Catalog, e.c.Box, "catalog")
	if err != nil || realKID != kid {
		t.Fatalf("load signing key: kid %q vs %q: %v", realKID, kid, err)
	}

	sign := func(method jwt.SigningMethod, c jwt.Claims, key any) string {
		tk := jwt.NewWithClaims(method, c)
		tk.Header["kid"] = kid
		s, err := tk.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	otherKey := make([]byte, 32)
	_, _ = rand.Read(otherKey)

	tampered := func() string {
		parts := strings.Split(good, ".")
		payload, err := base64.RawURLEncoding.DecodeString(parts[1])
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(payload, &m); err != nil {
			t.Fatal(err)
		}
		m["name"] = "mallory@example.com"
		m["exp"] = time.Now().Add(24 * 365 * time.Hour).Unix()
		b, _ := json.Marshal(m)
		parts[1] = base64.RawURLEncoding.EncodeToString(b)
		return strings.Join(parts, ".")
	}()
	expiredClaims := claims
	expiredClaims.IssuedAt = jwt.NewNumericDate(time.Now().Add(-3 * time.Hour))
	expiredClaims.NotBefore = expiredClaims.IssuedAt
	expiredClaims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Hour))
	past := func() time.Time { return time.Now().Add(-2 * time.Hour) }
	noExp := claims
	noExp.ExpiresAt = nil
	wrongIssuer := claims
	wrongIssuer.Issuer = "someone-else"
	orgSigner := auth.NewSigner(kid, realKey, "org:x", time.Hour, nil)
	orgTok, _, err := orgSigner.Issue(claims.Subject, claims.LoginID, claims.Name)
	if err != nil {
		t.Fatal(err)
	}
	pastTok, _, err := auth.NewSigner(kid, realKey, "platform", time.Hour, past).Issue(claims.Subject, claims.LoginID, claims.Name)
	if err != nil {
		t.Fatal(err)
	}
	noneTok := func() string {
		tk := jwt.NewWithClaims(jwt.SigningMethodNone, claims)
		tk.Header["kid"] = kid
		s, err := tk.SignedString(jwt.UnsafeAllowNoneSignatureType)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}()
	unknownKID := func() string {
		tk := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
		tk.Header["kid"] = "someotherkid"
		s, _ := tk.SignedString(realKey)
		return s
	}()

	cases := []struct{ name, token string }{
		{"tampered payload", tampered},
		{"foreign key, same kid", sign(jwt.SigningMethodHS256, claims, otherKey)},
		{"alg none", noneTok},
		{"HS512 with the real key", sign(jwt.SigningMethodHS512, claims, realKey)},
		{"expired (crafted claims)", sign(jwt.SigningMethodHS256, expiredClaims, realKey)},
		{"expired (signer with a past clock)", pastTok},
		{"no expiry", sign(jwt.SigningMethodHS256, noExp, realKey)},
		{"wrong issuer", sign(jwt.SigningMethodHS256, wrongIssuer, realKey)},
		{"audience org:x", orgTok},
		{"unknown kid", unknownKID},
		{"garbage", "a.b.c"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/api/v1/orgs", "/api/v1/audit"} {
				r := e.json(http.MethodGet, path, tc.token, nil)
				wantStatus(t, tc.name+" on "+path, r, http.StatusUnauthorized)
				if env := r.envelope(t); env.Error.Code != "unauthenticated" {
					t.Errorf("code %q", env.Error.Code)
				}
			}
			// The same token in the browser cookie is refused as well.
			r := e.do(request{method: "GET", path: "/admin/orgs", cookies: []*http.Cookie{{Name: "gh_login", Value: tc.token}}})
			wantStatus(t, tc.name+" as cookie", r, http.StatusSeeOther)
		})
	}
	// Sanity: a token minted with the real key for this session works, so
	// the rejections above are about what was changed.
	ok := sign(jwt.SigningMethodHS256, claims, realKey)
	wantStatus(t, "re-signed genuine claims", e.json(http.MethodGet, "/api/v1/orgs", ok, nil), http.StatusOK)
}

func TestPlatformLogoutRevokes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.SQLite)
	tok := e.adminToken()
	other := e.adminToken()
	wantStatus(t, "before logout", e.json(http.MethodGet, "/api/v1/orgs", tok, nil), http.StatusOK)
	wantStatus(t, "logout", e.json(http.MethodPost, "/api/v1/auth/logout", tok, nil), http.StatusNoContent)
	r := e.json(http.MethodGet, "/api/v1/orgs", tok, nil)
	wantStatus(t, "after logout", r, http.StatusUnauthorized)
	r.envelope(t)
	wantStatus(t, "logout again", e.json(http.MethodPost, "/api/v1/auth/logout", tok, nil), http.StatusUnauthorized)
	// Only that session ended.
	wantStatus(t, "another session of the same admin", e.json(http.MethodGet, "/api/v1/orgs", other, nil), http.StatusOK)
}
