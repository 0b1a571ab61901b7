package chaos_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/chaos"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestChaos runs three console replicas (real processes) on one Postgres,
// two agentd hosts and the E2B fake, drives twenty sessions through a
// balancer while a chaos loop SIGKILLs and restarts consoles, restarts an
// agentd once, cuts Postgres once and makes an org's database refuse
// connections once, and then checks the invariants (see
// chaos.Run and docs/operations.md, "Chaos run").
//
// Without GATEHOUSE_CHAOS it is the short version every test run makes
// (20 s of chaos, a kill every ~4 s); GATEHOUSE_CHAOS=5m makes it a long
// run of that duration (GATEHOUSE_CHAOS_KILL_EVERY sets the mean time
// between kills, default 5 s):
//
//	GATEHOUSE_CHAOS=5m go test -count=1 -run TestChaos ./internal/chaos/ -timeout 30m -v
func TestChaos(t *testing.T) {
	storetest.Crowded(t)
	o := chaos.Options{Duration: 20 * time.Second, KillEvery: 4 * time.Second}
	if v := os.Getenv("GATEHOUSE_CHAOS"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("GATEHOUSE_CHAOS=%q: want a duration such as 5m", v)
		}
		o.Duration, o.KillEvery = d, 5*time.Second
	}
	if v := os.Getenv("GATEHOUSE_CHAOS_KILL_EVERY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("GATEHOUSE_CHAOS_KILL_EVERY=%q: want a duration such as 5s", v)
		}
		o.KillEvery = d
	}
	dir := t.TempDir()
	o.ConsoleBin, o.AgentdBin = buildBinary(t, dir, "console"), buildBinary(t, dir, "agentd")
	o.PostgresDSN = storetest.AdminDSN(t)
	o.Progress = testWriter{t}

	ctx, cancel := context.WithTimeout(context.Background(), o.Duration+10*time.Minute)
	defer cancel()
	rep, err := chaos.Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	rep.Print(&b)
	t.Log(b.String())

	t.Run("faults were injected", func(t *testing.T) {
		if rep.Faults["console SIGKILL"] < 3 || rep.Faults["agentd restart"] != 1 || rep.Faults["Postgres cut"] != 1 ||
			rep.Faults["database refuses connections"] != 1 || rep.Faults["org suspend+resume"] < 1 {
			t.Errorf("faults injected: %v; want at least 3 kills, one agentd restart, one Postgres cut, one database refusing connections and one suspension", rep.Faults)
		}
	})
	t.Run("the driver was busy", func(t *testing.T) {
		if rep.Ops["counter"] == 0 || rep.Ops["interactive"] == 0 || rep.Ops["file write+read"] == 0 || rep.Served < 500 {
			t.Errorf("operations %v, %d requests served: the driver did not exercise every kind", rep.Ops, rep.Served)
		}
	})
	t.Run("every invariant held", func(t *testing.T) {
		for _, v := range rep.Violation {
			t.Error(v)
		}
	})
}

// buildBinary builds ./cmd/<name> of this module into dir.
func buildBinary(t *testing.T, dir, name string) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/%s: %v\n%s", name, err, msg)
	}
	return out
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// testWriter sends the run's progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}
