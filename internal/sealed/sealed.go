// Package sealed encrypts secrets at rest with AES-256-GCM under the master
// key. Associated data binds every ciphertext to the org and field it was
// sealed for, so a sealed value copied into another row or another org's
// database fails to open instead of silently decrypting.
package sealed

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// KeySize is the master key length: AES-256.
const KeySize = 32

// prefix versions the format so the key or algorithm can be rotated later.
const prefix = "v1:"

// ErrOpen is returned when a value cannot be opened: wrong key, wrong
// associated data, or tampered ciphertext. The cause is deliberately vague.
var ErrOpen = errors.New("sealed value cannot be opened")

// Box seals and opens values under one master key.
type Box struct {
	aead cipher.AEAD
}

// New returns a Box for a 32-byte key.
func New(key []byte) (*Box, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("master key must be %d bytes, got %d", KeySize, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("aes: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("gcm: %w", err)
	}
	return &Box{aead: aead}, nil
}

// AD builds associated data from the owner (org slug or "catalog") and the
// field a secret belongs to, e.g. AD("acme", "environment/12/agentd_token").
func AD(owner, field string) string { return owner + "\x00" + field }

// Seal encrypts plaintext bound to ad and returns printable text.
func (b *Box) Seal(plaintext []byte, ad string) (string, error) {
	nonce := make([]byte, b.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("nonce: %w", err)
	}
	out := b.aead.Seal(nonce, nonce, plaintext, []byte(ad))
	return prefix + base64.RawStdEncoding.EncodeToString(out), nil
}

// Open decrypts a value produced by Seal with the same ad.
func (b *Box) Open(sealedText, ad string) ([]byte, error) {
	raw, ok := strings.CutPrefix(sealedText, prefix)
	if !ok {
		return nil, ErrOpen
	}
	data, err := base64.RawStdEncoding.DecodeString(raw)
	if err != nil || len(data) < b.aead.NonceSize() {
		return nil, ErrOpen
	}
	n := b.aead.NonceSize()
	pt, err := b.aead.Open(nil, data[:n], data[n:], []byte(ad))
	if err != nil {
		return nil, ErrOpen
	}
	return pt, nil
}

// ParseKey accepts a master key as 64 hex characters or standard/URL base64
// of 32 bytes, the forms an operator is likely to paste.
func ParseKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if k, err := hex.DecodeString(s); err == nil && len(k) == KeySize {
		return k, nil
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if k, err := enc.DecodeString(s); err == nil && len(k) == KeySize {
			return k, nil
		}
	}
	return nil, fmt.Errorf("master key must be %d bytes as 64 hex characters or base64", KeySize)
}

// LoadOrCreateKeyFile reads the master key from path, or generates one there
// with mode 0600 when it does not exist (the embedded default). A key file
// readable by group or others is refused: it would expose every secret.
func LoadOrCreateKeyFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err == nil {
		if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("master key file %s has mode %v; it must not be readable by others (chmod 600)", path, st.Mode().Perm())
		}
		return ParseKey(string(data))
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read master key: %w", err)
	}
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("generate master key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create master key file: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(hex.EncodeToString(key) + "\n"); err != nil {
		return nil, fmt.Errorf("write master key file: %w", err)
	}
	return key, f.Sync()
}
