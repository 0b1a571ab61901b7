package directory

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/store"
)

// KeyRole is a role a service key holds in a domain.
type KeyRole struct {
	Role   string `json:"role"`
	Domain string `json:"domain"`
}

// APIKey is a machine credential. The secret is never stored: only its
// SHA-256 (the secret has 256 bits of entropy, so a slow hash adds nothing).
type APIKey struct {
	ID          int64 `gorm:"primaryKey"`
	Prefix      string
	SecretHash  string
	Name        string
	OwnerUserID *int64
	CreatedBy   string
	// CreatedByUserID is the user who created the key (nil: unknown, or
	// made before it was recorded). The approval queue refuses them as a
	// decider of the key's requests.
	CreatedByUserID *int64
	Roles           string
	CreatedAt       time.Time
	ExpiresAt       *time.Time
	LastUsedAt      *time.Time
	RevokedAt       *time.Time
	// AgentID binds an e2b key (token e2b_<hex>) to the one agent whose
	// sessions it may create and use through the E2B-compatible API; nil
	// for ordinary keys (gh_<prefix>_<secret>). The two kinds never
	// authenticate each other's surface.
	AgentID *int64
}

// E2BPrefix starts every e2b key: the E2B SDKs accept only keys matching
// ^e2b_[0-9a-f]+$.
const E2BPrefix = "e2b_"

// e2bPrefixLen is how many hex digits after e2b_ name the key's row; the
// rest (52 hex digits, 208 bits) is the secret.
const e2bPrefixLen = 12

// IsE2B reports whether the key is an e2b key, bound to one agent.
func (k APIKey) IsE2B() bool { return k.AgentID != nil }

// TableName binds APIKey to its table.
func (APIKey) TableName() string { return "api_keys" }

// IsService reports whether the key acts as itself (with its own roles)
// rather than as its owner.
func (k APIKey) IsService() bool { return k.OwnerUserID == nil }

// Subject is who the key acts as in casbin.
func (k APIKey) Subject() string {
	if k.OwnerUserID != nil {
		return UserSubject(*k.OwnerUserID)
	}
	return fmt.Sprintf("key:%d", k.ID)
}

// Masked shows the key the way lists do: prefix only.
func (k APIKey) Masked() string {
	if k.IsE2B() {
		return E2BPrefix + k.Prefix + strings.Repeat("•", 8)
	}
	return "gh_" + k.Prefix + "_" + strings.Repeat("•", 8)
}

// Label is how audit records and principals name the key: its name and
// prefix, never the secret.
func (k APIKey) Label() string {
	if k.IsE2B() {
		return E2BPrefix + k.Prefix
	}
	return "gh_" + k.Prefix
}

// RoleList decodes the stored roles.
func (k APIKey) RoleList() []KeyRole {
	var rs []KeyRole
	_ = json.Unmarshal([]byte(k.Roles), &rs)
	return rs
}

// NewKey is what creating a key needs.
type NewKey struct {
	Name      string
	Owner     *int64
	CreatedBy string
	// CreatedByUserID is the creating user's id, when a user created it.
	CreatedByUserID *int64
	Roles           []KeyRole
	ExpiresAt       *time.Time
	// Agent makes an e2b key bound to that agent (personal keys only);
	// the caller checks that the owner may use the agent.
	Agent *int64
}

func hashSecret(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// CreateKey stores a key and returns it with the full token, shown once.
func (d *Directory) CreateKey(ctx context.Context, in NewKey) (APIKey, string, error) {
	in.Name = strings.TrimSpace(in.Name)
	v := apperr.Validation()
	if in.Name == "" || len(in.Name) > 100 {
		v.Add("name", "Name must be 1 to 100 characters.")
	}
	if in.ExpiresAt != nil && !in.ExpiresAt.After(d.now()) {
		v.Add("expires_at", "Expiry must be in the future.")
	}
	if in.Owner != nil && len(in.Roles) > 0 {
		v.Add("roles", "A personal key acts with its owner's roles; only service keys take roles.")
	}
	if in.Agent != nil && in.Owner == nil {
		v.Add("agent_id", "An e2b key acts as the person who mints it; service keys cannot be bound to an agent.")
	}
	if in.Owner == nil && len(in.Roles) == 0 && in.Agent == nil {
		v.Add("roles", "A service key needs at least one role.")
	}
	if err := v.Err(); err != nil {
		return APIKey{}, "", err
	}
	roles, _ := json.Marshal(in.Roles)
	if in.Roles == nil {
		roles = []byte("[]")
	}
	for attempt := 0; attempt < 3; attempt++ {
		prefix := strings.ToLower(strings.NewReplacer("-", "x", "_", "y").Replace(auth.RandomToken(6)))
		secret := auth.RandomToken(32)
		token := func() string { return "gh_" + prefix + "_" + secret }
		if in.Agent != nil {
			// Hex only (the SDKs' check): 12 digits name the row (never
			// equal to an ordinary key's 8-character prefix), 52 are secret.
			all := auth.RandomHex(32)
			prefix, secret = all[:e2bPrefixLen], all[e2bPrefixLen:]
			token = func() string { return E2BPrefix + prefix + secret }
		}
		k := APIKey{Prefix: prefix, SecretHash: hashSecret(secret), Name: in.Name, OwnerUserID: in.Owner, CreatedBy: in.CreatedBy, CreatedByUserID: in.CreatedByUserID,
			Roles: string(roles), CreatedAt: d.now(), ExpiresAt: in.ExpiresAt, AgentID: in.Agent}
		err := d.DB.WithContext(ctx).Create(&k).Error
		if err == nil {
			return k, token(), nil
		}
		if !store.IsUniqueViolation(err) {
			return APIKey{}, "", fmt.Errorf("create api key: %w", err)
		}
	}
	return APIKey{}, "", fmt.Errorf("create api key: prefix collisions")
}

// ListKeys lists keys, all or those owned by one user.
func (d *Directory) ListKeys(ctx context.Context, owner *int64) ([]APIKey, error) {
	var ks []APIKey
	q := d.DB.WithContext(ctx).Order("id")
	if owner != nil {
		q = q.Where("owner_user_id = ?", *owner)
	}
	if err := q.Find(&ks).Error; err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	return ks, nil
}

// GetKey returns one key.
func (d *Directory) GetKey(ctx context.Context, id int64) (APIKey, error) {
	return store.ByID[APIKey](ctx, d.DB, id, "api key")
}

// RevokeKey revokes a key; the next request with it fails.
func (d *Directory) RevokeKey(ctx context.Context, id int64) (APIKey, error) {
	k, err := d.GetKey(ctx, id)
	if err != nil {
		return k, err
	}
	if k.RevokedAt != nil {
		return k, apperr.New(apperr.ErrConflict, "already_revoked", "This API key is already revoked.")
	}
	now := d.now()
	if err := d.DB.WithContext(ctx).Model(&APIKey{}).Where("id = ?", id).Update("revoked_at", now).Error; err != nil {
		return k, fmt.Errorf("revoke api key: %w", err)
	}
	k.RevokedAt = &now
	return k, nil
}

// splitToken names a presented token's row and secret: gh_<prefix>_<secret>
// for ordinary keys, e2b_<12 hex prefix><secret hex> for e2b keys.
func splitToken(token string) (prefix, secret string, e2b, ok bool) {
	if rest, isE2B := strings.CutPrefix(token, E2BPrefix); isE2B {
		if len(rest) <= e2bPrefixLen || strings.Trim(rest, "0123456789abcdef") != "" {
			return "", "", true, false
		}
		return rest[:e2bPrefixLen], rest[e2bPrefixLen:], true, true
	}
	rest, ok := strings.CutPrefix(token, "gh_")
	prefix, secret, ok2 := strings.Cut(rest, "_")
	return prefix, secret, false, ok && ok2 && prefix != "" && secret != ""
}

// VerifyKey checks a presented token, gh_<prefix>_<secret> or an e2b key.
// It fails for revoked or expired keys, for personal keys whose owner is
// disabled, and when the token's shape is not its row's kind (an e2b row
// is never reached through a gh_ token, nor the reverse); callers decide
// which kind their surface takes (APIKey.IsE2B).
func (d *Directory) VerifyKey(ctx context.Context, token string) (APIKey, *User, error) {
	bad := errBadKey()
	prefix, secret, e2b, ok := splitToken(token)
	if !ok {
		return APIKey{}, nil, bad
	}
	var k APIKey
	res := d.DB.WithContext(ctx).Where("prefix = ?", prefix).Limit(1).Find(&k)
	if res.Error != nil {
		return k, nil, fmt.Errorf("read api key: %w", res.Error)
	}
	want := k.SecretHash
	if res.RowsAffected == 0 {
		want = strings.Repeat("0", 64)
	}
	if subtle.ConstantTimeCompare([]byte(hashSecret(secret)), []byte(want)) != 1 || res.RowsAffected == 0 || k.IsE2B() != e2b {
		return APIKey{}, nil, bad
	}
	owner, err := d.liveKey(ctx, k)
	if err != nil {
		return APIKey{}, nil, err
	}
	now := d.now()
	// Record use at most once a minute: a write per request would make
	// every API call a database write.
	if k.LastUsedAt == nil || now.Sub(*k.LastUsedAt) > time.Minute {
		d.DB.WithContext(ctx).Model(&APIKey{}).Where("id = ?", k.ID).Update("last_used_at", now)
		k.LastUsedAt = &now
	}
	return k, owner, nil
}

func errBadKey() error {
	return apperr.New(apperr.ErrUnauthorized, "invalid_api_key", "The API key is invalid, expired or revoked.")
}

// liveKey checks that a key row still authenticates (not revoked, not
// expired, its owner active) and returns its owner.
func (d *Directory) liveKey(ctx context.Context, k APIKey) (*User, error) {
	now := d.now()
	if k.RevokedAt != nil || (k.ExpiresAt != nil && !now.Before(*k.ExpiresAt)) {
		return nil, errBadKey()
	}
	if k.OwnerUserID == nil {
		return nil, nil
	}
	u, err := d.GetUser(ctx, *k.OwnerUserID)
	if errors.Is(err, apperr.ErrNotFound) || err == nil && u.Status != StatusActive {
		return nil, errBadKey()
	}
	if err != nil {
		// The database failing between the two reads is an outage
		// (503), not a bad key: a 401 tells the caller to stop trying.
		return nil, err
	}
	return &u, nil
}

// LiveKey returns key id and its owner while the key still authenticates:
// for credentials that stand for a key without carrying it (an e2b
// sandbox's envd token acts as the key that created the sandbox).
func (d *Directory) LiveKey(ctx context.Context, id int64) (APIKey, *User, error) {
	k, err := d.GetKey(ctx, id)
	if errors.Is(err, apperr.ErrNotFound) {
		return APIKey{}, nil, errBadKey()
	}
	if err != nil {
		return APIKey{}, nil, err
	}
	owner, err := d.liveKey(ctx, k)
	if err != nil {
		return APIKey{}, nil, err
	}
	return k, owner, nil
}
