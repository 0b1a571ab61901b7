package auth_test

import (
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/auth"
)

// TestPasswordCost: a zero cost hashes at the production default, a set
// cost is what the hash records, and a hash verifies whatever cost checks
// it (the hash carries its own parameters), so lowering or raising the
// cost never locks anyone out.
func TestPasswordCost(t *testing.T) {
	low := auth.PasswordCost{Time: 1, MemoryKiB: 64}
	for _, tc := range []struct {
		name string
		cost auth.PasswordCost
		want string
	}{
		{"zero is the default", auth.PasswordCost{}, "$m=19456,t=2,p=1$"},
		{"the default", auth.DefaultPasswordCost, "$m=19456,t=2,p=1$"},
		{"a lowered cost", low, "$m=64,t=1,p=1$"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := tc.cost.Hash("correct horse battery")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(h, tc.want) {
				t.Fatalf("hash %q does not record %s", h, tc.want)
			}
			for _, checker := range []auth.PasswordCost{{}, low} {
				if !checker.Check(h, "correct horse battery") || checker.Check(h, "wrong horse battery") {
					t.Errorf("cost %+v does not verify a hash made at %+v", checker, tc.cost)
				}
			}
		})
	}
	if h, _ := auth.HashPassword("x-long-enough-password"); !strings.Contains(h, "$m=19456,t=2,p=1$") {
		t.Errorf("HashPassword made %q, not at the default cost", h)
	}
	if low.Check("", "anything") || auth.CheckPassword("", "anything") {
		t.Error("an unknown account's check passed")
	}
}

// TestRandomHex: n bytes are 2n lowercase hex digits (what E2B keys and
// tokens must be), and two draws differ.
func TestRandomHex(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 32} {
		s := auth.RandomHex(n)
		if len(s) != 2*n || strings.Trim(s, "0123456789abcdef") != "" {
			t.Fatalf("RandomHex(%d) = %q, want %d lowercase hex digits", n, s, 2*n)
		}
	}
	if a, b := auth.RandomHex(16), auth.RandomHex(16); a == b {
		t.Fatalf("two draws of 16 bytes were both %s", a)
	}
}
