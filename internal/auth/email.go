package auth

import (
	"fmt"
	"net/mail"
	"strings"
)

// NormalizeEmail lowercases and trims; emails compare case-insensitively.
func NormalizeEmail(e string) string { return strings.ToLower(strings.TrimSpace(e)) }

// MaxEmailLength is the longest address SMTP allows (RFC 5321); it also
// keeps the unique e-mail indexes within Postgres's B-tree entry limit.
const MaxEmailLength = 254

// ValidateEmail explains what is wrong with an email address, or "".
func ValidateEmail(e string) string {
	if len(e) > MaxEmailLength {
		return fmt.Sprintf("An email address has at most %d characters.", MaxEmailLength)
	}
	if a, err := mail.ParseAddress(e); err != nil || a.Address != e {
		return "Enter a valid email address, like name@example.com."
	}
	return ""
}
