package sso_test

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/sso"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestResolveCreatesUserWithLongNonASCIIName: a provider's name longer
// than the column's budget, in characters of several bytes, is cut on a
// character, so Postgres stores it and the sign-in creates the account.
func TestResolveCreatesUserWithLongNonASCIIName(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		db := storetest.Open(t, d, store.OrgSet)
		yes := true
		id := sso.Identity{Issuer: "https://idp.test", Subject: "s-1", Email: "ada@acme.test", EmailVerified: &yes,
			Name: strings.Repeat("日", 100)} // 300 bytes: the 200-byte cut falls inside a character
		err := db.Transaction(func(tx *gorm.DB) error {
			u, outcome, err := sso.Resolve(context.Background(), tx, sso.Config{}, id, time.Now())
			if err != nil {
				return err
			}
			if outcome != sso.OutcomeCreated || !utf8.ValidString(u.Name) || !strings.HasPrefix(u.Name, "日日") || len(u.Name) > 203 {
				t.Errorf("created %q (%d bytes) as %s", u.Name, len(u.Name), outcome)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("resolve: %v", err)
		}
	})
}
