package auth

import (
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// ErrInvalidToken covers every reason a token is refused; the reason is in
// the wrapped error for logs, never for clients.
var ErrInvalidToken = errors.New("invalid or expired token")

// Claims are what Gatehouse puts in its JWTs.
type Claims struct {
	jwt.RegisteredClaims
	// LoginID names the server-side sign-in (login) so logout and disabling an
	// account take effect on the next request.
	LoginID string `json:"sid"`
	// Name is a display name for pages; never trusted for authorization.
	Name string `json:"name,omitempty"`
	// Parent is the platform sign-in a platform admin entered an org
	// from; the org sign-in ends when it does.
	Parent string `json:"psid,omitempty"`
}

// Signer issues and verifies HS256 tokens for one audience (the platform,
// or one org): a token of one audience never verifies for another, and the
// keys differ too.
type Signer struct {
	kid      string
	key      []byte
	audience string
	issuer   string
	ttl      time.Duration
	now      func() time.Time
}

// NewSigner returns a Signer. audience is "platform" or "org:<slug>".
func NewSigner(kid string, key []byte, audience string, ttl time.Duration, now func() time.Time) *Signer {
	if now == nil {
		now = time.Now
	}
	return &Signer{kid: kid, key: key, audience: audience, issuer: "gatehouse", ttl: ttl, now: now}
}

// TTL is how long issued tokens live.
func (s *Signer) TTL() time.Duration { return s.ttl }

// Issue signs a token for subject bound to a server-side sign-in (login).
func (s *Signer) Issue(subject, loginID, name string) (string, time.Time, error) {
	return s.IssueChild(subject, loginID, name, "")
}

// IssueChild is Issue for a login that lives only as long as a parent
// login elsewhere (a platform admin inside an org).
func (s *Signer) IssueChild(subject, loginID, name, parent string) (string, time.Time, error) {
	now := s.now()
	exp := now.Add(s.ttl)
	c := Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    s.issuer,
			Subject:   subject,
			Audience:  jwt.ClaimStrings{s.audience},
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now.Add(-time.Second)),
			ExpiresAt: jwt.NewNumericDate(exp),
			ID:        RandomToken(12),
		},
		LoginID: loginID,
		Name:    name,
		Parent:  parent,
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, c)
	tok.Header["kid"] = s.kid
	signed, err := tok.SignedString(s.key)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("sign token: %w", err)
	}
	return signed, exp, nil
}

// Verify checks the algorithm (HS256 only: "none" and asymmetric
// algorithms are refused), key id, signature, expiry, issuer and audience.
func (s *Signer) Verify(token string) (*Claims, error) {
	var c Claims
	_, err := jwt.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		if kid, _ := t.Header["kid"].(string); kid != s.kid {
			return nil, fmt.Errorf("unknown key id %q", kid)
		}
		return s.key, nil
	},
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithAudience(s.audience),
		jwt.WithIssuer(s.issuer),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(s.now),
		jwt.WithLeeway(5*time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	if c.LoginID == "" || c.Subject == "" {
		return nil, fmt.Errorf("%w: missing subject or login", ErrInvalidToken)
	}
	return &c, nil
}
