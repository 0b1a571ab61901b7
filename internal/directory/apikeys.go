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
	Roles       string
	CreatedAt   time.Time
	ExpiresAt   *time.Time
	LastUsedAt  *time.Time
	RevokedAt   *time.Time
}

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
func (k APIKey) Masked() string { return "gh_" + k.Prefix + "_" + strings.Repeat("•", 8) }

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
	Roles     []KeyRole
	ExpiresAt *time.Time
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
	if in.Owner == nil && len(in.Roles) == 0 {
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
		k := APIKey{Prefix: prefix, SecretHash: hashSecret(secret), Name: in.Name, OwnerUserID: in.Owner, CreatedBy: in.CreatedBy,
			Roles: string(roles), CreatedAt: d.now(), ExpiresAt: in.ExpiresAt}
		err := d.DB.WithContext(ctx).Create(&k).Error
		if err == nil {
			return k, "gh_" + prefix + "_" + secret, nil
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

// VerifyKey checks a presented token gh_<prefix>_<secret>. It fails for
// revoked or expired keys and for personal keys whose owner is disabled.
func (d *Directory) VerifyKey(ctx context.Context, token string) (APIKey, *User, error) {
	bad := apperr.New(apperr.ErrUnauthorized, "invalid_api_key", "The API key is invalid, expired or revoked.")
	rest, ok := strings.CutPrefix(token, "gh_")
	prefix, secret, ok2 := strings.Cut(rest, "_")
	if !ok || !ok2 || prefix == "" || secret == "" {
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
	if subtle.ConstantTimeCompare([]byte(hashSecret(secret)), []byte(want)) != 1 || res.RowsAffected == 0 {
		return APIKey{}, nil, bad
	}
	now := d.now()
	if k.RevokedAt != nil || (k.ExpiresAt != nil && !now.Before(*k.ExpiresAt)) {
		return APIKey{}, nil, bad
	}
	var owner *User
	if k.OwnerUserID != nil {
		u, err := d.GetUser(ctx, *k.OwnerUserID)
		if errors.Is(err, apperr.ErrNotFound) || err == nil && u.Status != StatusActive {
			return APIKey{}, nil, bad
		}
		if err != nil {
			// The database failing between the two reads is an outage
			// (503), not a bad key: a 401 tells the caller to stop trying.
			return APIKey{}, nil, err
		}
		owner = &u
	}
	// Record use at most once a minute: a write per request would make
	// every API call a database write.
	if k.LastUsedAt == nil || now.Sub(*k.LastUsedAt) > time.Minute {
		d.DB.WithContext(ctx).Model(&APIKey{}).Where("id = ?", k.ID).Update("last_used_at", now)
		k.LastUsedAt = &now
	}
	return k, owner, nil
}
