package directory

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// AuthCache remembers, for a short time, the credentials an org's requests
// presented and the rows that verified them (an API key and its owner, a
// sign-in and its user), so an agent runtime calling the terminal gateway
// in a loop does not read the same two or three rows on every call.
//
// Freshness: every update or delete of users, api_keys or user_logins
// through the org's database handle (any transaction or Directory built on
// it) clears the cache at once, and for TTL after such a write nothing is
// cached (a request that read the rows while the write was not yet
// committed must not keep them). Writes made by another replica are seen
// within TTL, the same bound as casbin policy changes (rbac reads
// policy_version every second). Only successes are cached: a refused
// credential is read again each time, so a new row (a sign-in, a key, a
// user) cannot make an entry wrong, and inserts leave the cache alone.
type AuthCache struct {
	// TTL is how long an entry is trusted; 0 means DefaultAuthTTL.
	TTL time.Duration
	Now func() time.Time

	mu        sync.Mutex
	gen       uint64
	clearedAt time.Time
	keys      map[[32]byte]keyEntry
	byID      map[int64]keyEntry
	logins    map[string]loginEntry
}

// DefaultAuthTTL bounds how stale a cached credential may be.
const DefaultAuthTTL = time.Second

// maxAuthEntries bounds the cache; beyond it, it starts over.
const maxAuthEntries = 10000

type keyEntry struct {
	key   APIKey
	owner *User
	at    time.Time
}

type loginEntry struct {
	user *User // nil for non-user subjects
	at   time.Time
}

// authTables are the tables whose rows verify a credential.
var authTables = []string{"users", "api_keys", "user_logins"}

// NewAuthCache returns a cache cleared by every update or delete of the
// credential tables made through db (the org's pool handle: callbacks are
// shared by every session and transaction derived from it).
func NewAuthCache(db *gorm.DB) (*AuthCache, error) {
	c := &AuthCache{}
	name := fmt.Sprintf("gatehouse:authcache:%p", c)
	cb := db.Callback()
	for _, err := range []error{
		cb.Update().After("gorm:update").Register(name, c.afterWrite),
		cb.Delete().After("gorm:delete").Register(name, c.afterWrite),
		cb.Raw().After("gorm:raw").Register(name, c.afterWrite),
	} {
		if err != nil {
			return nil, fmt.Errorf("auth cache: %w", err)
		}
	}
	return c, nil
}

func (c *AuthCache) afterWrite(db *gorm.DB) {
	if db.Statement == nil {
		return
	}
	if m, ok := db.Statement.Dest.(map[string]any); ok && len(m) == 1 && (m["last_used_at"] != nil || m["last_login_at"] != nil) {
		// Bookkeeping of when a key or account was last used changes no
		// credential's validity (and happens once a minute per key).
		return
	}
	t := db.Statement.Table
	sql := db.Statement.SQL.String()
	for _, name := range authTables {
		if t == name || strings.Contains(sql, name) {
			c.Clear()
			return
		}
	}
}

func (c *AuthCache) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *AuthCache) ttl() time.Duration {
	if c.TTL > 0 {
		return c.TTL
	}
	return DefaultAuthTTL
}

// Clear forgets every entry.
func (c *AuthCache) Clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.clearedAt = c.now()
	c.keys, c.byID, c.logins = nil, nil, nil
}

// begin returns the generation a lookup's reads belong to.
func (c *AuthCache) begin() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// storable reports whether what was read in generation gen may be kept:
// nothing was cleared since, nor within TTL before (a write may not have
// been committed when the rows were read). Call with c.mu held.
func (c *AuthCache) storable(gen uint64, now time.Time) bool {
	return gen == c.gen && (c.clearedAt.IsZero() || now.Sub(c.clearedAt) >= c.ttl())
}

// VerifyKey is Directory.VerifyKey through the cache.
func (c *AuthCache) VerifyKey(ctx context.Context, d *Directory, token string) (APIKey, *User, error) {
	h := sha256.Sum256([]byte(token))
	now := c.now()
	c.mu.Lock()
	e, ok := c.keys[h]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < c.ttl() && (e.key.ExpiresAt == nil || now.Before(*e.key.ExpiresAt)) {
		return e.key, e.owner, nil
	}
	gen := c.begin()
	k, owner, err := d.VerifyKey(ctx, token)
	if err != nil {
		return k, owner, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.storable(gen, now) {
		if c.keys == nil || len(c.keys) >= maxAuthEntries {
			c.keys = map[[32]byte]keyEntry{}
		}
		c.keys[h] = keyEntry{key: k, owner: owner, at: now}
	}
	return k, owner, nil
}

// LiveKey is Directory.LiveKey through the cache: revoking the key or
// disabling its owner clears it like any other credential change.
func (c *AuthCache) LiveKey(ctx context.Context, d *Directory, id int64) (APIKey, *User, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.byID[id]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < c.ttl() && (e.key.ExpiresAt == nil || now.Before(*e.key.ExpiresAt)) {
		return e.key, e.owner, nil
	}
	gen := c.begin()
	k, owner, err := d.LiveKey(ctx, id)
	if err != nil {
		return k, owner, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.storable(gen, now) {
		if c.byID == nil || len(c.byID) >= maxAuthEntries {
			c.byID = map[int64]keyEntry{}
		}
		c.byID[id] = keyEntry{key: k, owner: owner, at: now}
	}
	return k, owner, nil
}

// LoginUser checks that sign-in loginID of subject is live and, for a
// user subject ("user:<id>"), returns the user (whatever its status: the
// caller decides). ok is false for a sign-in that ended or never was, or
// whose user cannot be read.
func (c *AuthCache) LoginUser(ctx context.Context, d *Directory, loginID, subject string) (user *User, ok bool, err error) {
	k := loginID + "\x00" + subject
	now := c.now()
	c.mu.Lock()
	e, hit := c.logins[k]
	c.mu.Unlock()
	if hit && now.Sub(e.at) < c.ttl() {
		return e.user, true, nil
	}
	gen := c.begin()
	if ok, err := d.LoginValid(ctx, loginID, subject); err != nil || !ok {
		return nil, false, err
	}
	if rest, isUser := strings.CutPrefix(subject, "user:"); isUser {
		// As before the cache: a user that cannot be read is no sign-in.
		id, err := strconv.ParseInt(rest, 10, 64)
		if err != nil {
			return nil, false, nil
		}
		u, err := d.GetUser(ctx, id)
		if errors.Is(err, apperr.ErrNotFound) {
			return nil, false, nil
		}
		if err != nil {
			// A database failure is an outage, not a sign-in that ended.
			return nil, false, err
		}
		user = &u
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.storable(gen, now) {
		if c.logins == nil || len(c.logins) >= maxAuthEntries {
			c.logins = map[string]loginEntry{}
		}
		c.logins[k] = loginEntry{user: user, at: now}
	}
	return user, true, nil
}
