package sealed_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/sealed"
)

func newBox(t *testing.T) *sealed.Box {
	t.Helper()
	b, err := sealed.New([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSealOpen(t *testing.T) {
	t.Parallel()
	b := newBox(t)
	ct, err := b.Seal([]byte("s3cret"), sealed.AD("acme", "env/1/token"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ct, "s3cret") {
		t.Fatalf("ciphertext contains plaintext: %s", ct)
	}
	pt, err := b.Open(ct, sealed.AD("acme", "env/1/token"))
	if err != nil || string(pt) != "s3cret" {
		t.Fatalf("open = %q, %v", pt, err)
	}
	other, _ := sealed.New([]byte(strings.Repeat("x", 32)))
	cases := []struct {
		name string
		box  *sealed.Box
		ct   string
		ad   string
	}{
		{"other org", b, ct, sealed.AD("globex", "env/1/token")},
		{"other field", b, ct, sealed.AD("acme", "env/2/token")},
		{"other key", other, ct, sealed.AD("acme", "env/1/token")},
		{"tampered", b, ct[:len(ct)-2] + "AA", sealed.AD("acme", "env/1/token")},
		{"no prefix", b, "garbage", sealed.AD("acme", "env/1/token")},
	}
	for _, tc := range cases {
		if _, err := tc.box.Open(tc.ct, tc.ad); !errors.Is(err, sealed.ErrOpen) {
			t.Errorf("%s: err = %v, want ErrOpen", tc.name, err)
		}
	}
}

func TestKeyFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sub", "master.key")
	k1, err := sealed.LoadOrCreateKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, %v", st.Mode().Perm(), err)
	}
	k2, err := sealed.LoadOrCreateKeyFile(path)
	if err != nil || string(k1) != string(k2) {
		t.Fatalf("reload gave a different key: %v", err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := sealed.LoadOrCreateKeyFile(path); err == nil {
		t.Fatal("world-readable key file accepted")
	}
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{strings.Repeat("ab", 32), true},
		{"MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE=", true},
		{"short", false},
		{strings.Repeat("ab", 31), false},
	} {
		_, err := sealed.ParseKey(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseKey(%q) err = %v, want ok=%v", tc.in, err, tc.ok)
		}
	}
}
