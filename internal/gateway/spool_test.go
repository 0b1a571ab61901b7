package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// failingReader gives its bytes, then an error: a client that hung up.
type failingReader struct{ r io.Reader }

func (f failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, errors.New("connection reset")
	}
	return n, err
}

// TestSpoolBody checks the write route's promises about the body: a whole
// body is kept with its size and hash; one past MaxWriteBytes (unannounced)
// or one cut short is refused and leaves no spool file behind.
func TestSpoolBody(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("TMPDIR", dir)
	for _, tc := range []struct {
		name string
		body io.Reader
		code string
	}{
		{"whole", strings.NewReader("plan"), ""},
		{"past the limit", io.LimitReader(zeros{}, MaxWriteBytes+1), "body_too_large"},
		{"cut short", failingReader{strings.NewReader("half")}, "body_incomplete"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, size, sum, err := spoolBody(tc.body)
			if tc.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				defer func() { f.Close(); os.Remove(f.Name()) }()
				want := sha256.Sum256([]byte("plan"))
				got, rerr := io.ReadAll(f)
				if size != 4 || sum != hex.EncodeToString(want[:]) || string(got) != "plan" || rerr != nil {
					t.Fatalf("spooled %d bytes %q, sha256 %s (%v)", size, got, sum, rerr)
				}
				return
			}
			var ae *apperr.Error
			if !errors.As(err, &ae) || ae.Code != tc.code || !errors.Is(err, apperr.ErrInvalid) {
				t.Fatalf("err = %v, want %s", err, tc.code)
			}
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Fatalf("%d spool files left behind", len(left))
			}
		})
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
