package config_test

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/gatehouse/gatehouse/internal/config"
)

// TestDataDirIsAbsolute: a relative data dir (the default "data", or one
// given by flag or environment) is resolved against the working directory
// at start, so code that runs elsewhere (a local sandbox's agentd starts
// in its own directory) finds the same files.
func TestDataDirIsAbsolute(t *testing.T) {
	t.Parallel()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	abs := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{name: "default", want: filepath.Join(wd, "data")},
		{name: "relative flag", args: []string{"--data-dir", "./x/../mine"}, want: filepath.Join(wd, "mine")},
		{name: "relative environment", env: map[string]string{"GATEHOUSE_DATA_DIR": "var/gh"}, want: filepath.Join(wd, "var", "gh")},
		{name: "absolute stays", args: []string{"--data-dir", abs + "/"}, want: abs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := config.Load("console", tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if c.DataDir != tc.want {
				t.Fatalf("data dir %q, want %q", c.DataDir, tc.want)
			}
		})
	}
}
