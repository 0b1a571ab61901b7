package release_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd/release"
)

// TestCatalog: a release directory's files count by their names alone
// (agentd-<os>-<arch>, .exe exactly for Windows); its build for the
// console's own platform is served instead of the console's binary; and
// SHA256SUMS names each as in a release directory.
func TestCatalog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	self := filepath.Join(t.TempDir(), "console")
	for name, body := range map[string]string{
		"agentd-linux-amd64":       "released amd64",
		"agentd-windows-amd64.exe": "windows",
		"agentd-darwin-arm64.exe":  "not windows, so not a build",
		"agentd-windows-arm64":     "windows without .exe",
		"agentd":                   "no platform",
		"SHA256SUMS":               "not a build",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(self, []byte("console"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := &release.Catalog{Self: self, SelfPlatform: "linux-amd64", Dir: dir}
	builds, err := c.Builds()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range builds {
		got = append(got, b.Platform+"="+filepath.Base(b.Path)+"/"+b.FileName())
	}
	want := []string{"linux-amd64=agentd-linux-amd64/agentd", "windows-amd64=agentd-windows-amd64.exe/agentd.exe"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("builds %q, want %q", got, want)
	}
	if sums := release.Sums(builds); sums[:64] != builds[0].SHA256 || sums[64:] != "  agentd-linux-amd64\n"+builds[1].SHA256+"  agentd-windows-amd64.exe\n" {
		t.Errorf("SHA256SUMS:\n%s", sums)
	}
	if _, err := c.Find("darwin-arm64"); err != release.ErrUnknownPlatform {
		t.Errorf("Find(darwin-arm64): %v", err)
	}
	for platform, label := range map[string]string{"linux-amd64": "Linux x86-64", "linux-arm64": "Linux ARM64", "darwin-arm64": "macOS Apple silicon", "windows-amd64": "Windows x86-64"} {
		if got := release.Label(platform); got != label {
			t.Errorf("Label(%s) = %q, want %q", platform, got, label)
		}
	}
}
