// Package auth holds credentials: password hashing, JWT issue and
// verification, API keys, CSRF tokens and login throttling. It knows nothing
// of HTTP frameworks.
package auth

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/argon2"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// PasswordCost is argon2id's time (passes) and memory for new hashes. A
// hash records its own parameters, so a stored hash verifies whatever the
// cost is now. The zero value is DefaultPasswordCost; nothing in the
// console's flags changes it (tests lower it: thousands of accounts at the
// production cost take minutes under the race detector).
type PasswordCost struct {
	Time      uint32
	MemoryKiB uint32
}

// DefaultPasswordCost: RFC 9106's second recommendation with lighter
// memory, so a 2-core box can take a login burst.
var DefaultPasswordCost = PasswordCost{Time: 2, MemoryKiB: 19 * 1024}

const (
	argonThreads = 1
	argonKeyLen  = 32
)

// MinPasswordLength is enforced whenever a password is chosen.
const MinPasswordLength = 12

// ErrWeakPassword explains the password rule.
var ErrWeakPassword = fmt.Errorf("password must be at least %d characters", MinPasswordLength)

func (c PasswordCost) orDefault() PasswordCost {
	if c.Time == 0 || c.MemoryKiB == 0 {
		return DefaultPasswordCost
	}
	return c
}

// HashPassword returns an encoded argon2id hash at the default cost.
func HashPassword(pw string) (string, error) { return PasswordCost{}.Hash(pw) }

// Hash returns an encoded argon2id hash of pw at cost c.
func (c PasswordCost) Hash(pw string) (string, error) {
	c = c.orDefault()
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	key := argon2.IDKey([]byte(pw), salt, c.Time, c.MemoryKiB, argonThreads, argonKeyLen)
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, c.MemoryKiB, c.Time, argonThreads,
		base64.RawStdEncoding.EncodeToString(salt), base64.RawStdEncoding.EncodeToString(key)), nil
}

// dummyHash is verified against when an account does not exist, so the
// answer's time does not reveal whether the e-mail is known: it costs what
// a hash made at c costs (its key matches nothing).
func (c PasswordCost) dummyHash() string {
	c = c.orDefault()
	return fmt.Sprintf("$argon2id$v=19$m=%d,t=%d,p=%d$c29tZXNhbHRzb21lc2FsdA$0t6oB3OYGqV5zq9o0Jx3c3KtXQ4bM2f6q3pGZK5lH6A", c.MemoryKiB, c.Time, argonThreads)
}

// CheckPassword reports whether pw matches encoded; an unknown account
// (empty encoded) costs a hash at the default cost.
func CheckPassword(encoded, pw string) bool { return PasswordCost{}.Check(encoded, pw) }

// Check reports whether pw matches encoded. An empty encoded hash (unknown
// account) still costs one hash computation at cost c, and is false.
func (c PasswordCost) Check(encoded, pw string) bool {
	if encoded == "" {
		_, _ = verifyArgon(c.dummyHash(), pw)
		return false
	}
	ok, err := verifyArgon(encoded, pw)
	return err == nil && ok
}

func verifyArgon(encoded, pw string) (bool, error) {
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return false, errors.New("unknown hash format")
	}
	var m uint32
	var t uint32
	var p uint8
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &m, &t, &p); err != nil {
		return false, err
	}
	salt, err := base64.RawStdEncoding.DecodeString(parts[4])
	if err != nil {
		return false, err
	}
	want, err := base64.RawStdEncoding.DecodeString(parts[5])
	if err != nil {
		return false, err
	}
	got := argon2.IDKey([]byte(pw), salt, t, m, p, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1, nil
}

// NewPasswordHash checks a password change — the current password must
// match currentHash, the new one must be long enough and different — and
// returns the new hash, or a validation error naming the fields "current"
// and "new". Platform admins and org users share this rule.
func NewPasswordHash(currentHash, current, next string) (string, error) {
	return PasswordCost{}.NewHash(currentHash, current, next)
}

// NewHash is NewPasswordHash with the new hash made at cost c.
func (c PasswordCost) NewHash(currentHash, current, next string) (string, error) {
	v := apperr.Validation()
	if !c.Check(currentHash, current) {
		v.Add("current", "The current password is incorrect.")
	}
	if len(next) < MinPasswordLength {
		v.Add("new", "The new password must be at least %d characters.", MinPasswordLength)
	} else if next == current {
		v.Add("new", "The new password must differ from the current one.")
	}
	if err := v.Err(); err != nil {
		return "", err
	}
	return c.Hash(next)
}

// RandomPassword returns a one-time password that is easy to type and
// carries about 120 bits.
func RandomPassword() string {
	return RandomToken(15)
}

// RandomToken returns n random bytes as unpadded URL-safe base64.
func RandomToken(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// RandomHex returns n random bytes as 2n lowercase hex digits, for secrets
// and names whose readers accept hex only (E2B keys and tokens, database
// names).
func RandomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b)
}
