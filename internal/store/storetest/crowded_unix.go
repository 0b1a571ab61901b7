//go:build unix

package storetest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Crowded marks a test that holds many Postgres connections at once
// (several consoles as processes, each with its pools): such tests take
// turns across every test binary on the machine, holding a file lock
// until the test ends, so together they stay under the server's
// max_connections (100 by default) while other packages run beside them.
func Crowded(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "gatehouse-test-postgres-crowded.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("crowded-test lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("crowded-test lock: %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	})
}
