package auth_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestSigningKeyRaceEndsWithOneKey: replicas opening a new org at once
// (a request on one, background sweeps on the others) may each create a
// signing key; every one of them, and every later opener, must sign and
// verify with the same key, or a token minted on one replica is refused
// on another once it restarts.
func TestSigningKeyRaceEndsWithOneKey(t *testing.T) {
	t.Parallel()
	box, err := sealed.New([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		db := storetest.Open(t, d, store.OrgSet)
		ctx := context.Background()
		// The race's outcome, made certain: two keys stored.
		first, _, err := auth.LoadOrCreateSigningKey(ctx, db, box, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Exec("INSERT INTO signing_keys (kid, sealed_key, created_at) SELECT 'racer', sealed_key, created_at FROM signing_keys").Error; err != nil {
			t.Fatal(err)
		}
		const openers = 8
		kids := make([]string, openers)
		var wg sync.WaitGroup
		for i := range openers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				kid, _, err := auth.LoadOrCreateSigningKey(ctx, db, box, "acme")
				if err != nil {
					t.Error(err)
				}
				kids[i] = kid
			}()
		}
		wg.Wait()
		for i, kid := range kids {
			if kid != first {
				t.Errorf("opener %d signs with %q, the first key is %q", i, kid, first)
			}
		}
	})
}
