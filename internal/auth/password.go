// Package auth holds credentials: password hashing, JWT issue and
// verification, API keys, CSRF tokens and login throttling. It knows nothing
// of HTTP frameworks.
package auth

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/argon2"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// argon2id parameters (RFC 9106 second recommendation, lighter memory so a
// 2-core box can take a login burst).
const (
	argonTime    = 2
	argonMemory  = 19 * 1024
	argonThreads = 1
	argonKeyLen  = 32
)

// MinPasswordLength is enforced whenever a password is chosen.
const MinPasswordLength = 12

// ErrWeakPassword explains the password rule.
var ErrWeakPassword = fmt.Errorf("password must be at least %d characters", MinPasswordLength)

// HashPassword returns an encoded argon2id hash.
func HashPassword(pw string) (string, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	key := argon2.IDKey([]byte(pw), salt, argonTime, argonMemory, argonThreads, argonKeyLen)
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, argonMemory, argonTime, argonThreads,
		base64.RawStdEncoding.EncodeToString(salt), base64.RawStdEncoding.EncodeToString(key)), nil
}

// dummyHash is verified against when an account does not exist, so the
// response time does not reveal whether the email is known.
const dummyHash = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$0t6oB3OYGqV5zq9o0Jx3c3KtXQ4bM2f6q3pGZK5lH6A"

// CheckPassword reports whether pw matches encoded. An empty encoded hash
// (unknown account) still costs one hash computation.
func CheckPassword(encoded, pw string) bool {
	if encoded == "" {
		encoded = dummyHash
		ok, _ := verifyArgon(encoded, pw)
		_ = ok
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
	v := apperr.Validation()
	if !CheckPassword(currentHash, current) {
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
	return HashPassword(next)
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
