package auth

import (
	"net/mail"
	"strings"
)

// NormalizeEmail lowercases and trims; emails compare case-insensitively.
func NormalizeEmail(e string) string { return strings.ToLower(strings.TrimSpace(e)) }

// ValidateEmail explains what is wrong with an email address, or "".
func ValidateEmail(e string) string {
	if a, err := mail.ParseAddress(e); err != nil || a.Address != e {
		return "Enter a valid email address, like name@example.com."
	}
	return ""
}
