package agentd

import "fmt"

// MinTokenLength is the shortest bearer token agentd accepts. The console
// applies the same rule to the token it stores for an environment (and
// generates longer ones), so a token one side takes the other never refuses.
const MinTokenLength = 16

// CheckToken applies the token rule. The message names the length, never
// the token.
func CheckToken(tok string) error {
	if n := len(tok); n < MinTokenLength {
		return fmt.Errorf("the agentd token has %d characters; it must have at least %d (generate one with: openssl rand -base64 32)", n, MinTokenLength)
	}
	return nil
}
