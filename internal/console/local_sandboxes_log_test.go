package console_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
)

// TestLocalSandboxesLogNoSecrets: the start-up log line of the local
// sandbox backend names the file holding its API key and agentd token,
// which is enough to register it by hand, and prints neither secret.
func TestLocalSandboxesLogNoSecrets(t *testing.T) {
	bin, err := e2bfaketest.BuildAgentd(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	local, err := console.StartLocalSandboxesFrom(dataDir, bin.Path, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := local.Close(); err != nil {
			t.Errorf("close the local backend: %v", err)
		}
	})
	line := local.Describe()
	for name, secret := range map[string]string{"API key": local.APIKey, "agentd token": local.AgentdToken} {
		if secret == "" || strings.Contains(line, secret) {
			t.Errorf("the start-up log line holds the %s (%q): %s", name, secret, line)
		}
	}
	state := filepath.Join(dataDir, "local-sandboxes", "backend.json")
	if !strings.Contains(line, state) || !strings.Contains(line, local.Server.URL()) {
		t.Fatalf("the start-up log line %q does not name %s and the API URL", line, state)
	}
	// The file it names holds what registering by hand takes.
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		APIKey      string `json:"api_key"`
		AgentdToken string `json:"agentd_token"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.APIKey != local.APIKey || st.AgentdToken != local.AgentdToken {
		t.Fatalf("%s holds %+v (%v), want the backend's API key and agentd token", state, st, err)
	}
}
