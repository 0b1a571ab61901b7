package e2bfake_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
)

// createWithMount is a create body whose metadata carries host-mount.
func createWithMount(mount string) string {
	b, _ := json.Marshal(map[string]any{"templateID": "base", "metadata": map[string]string{e2bfake.MetaHostMount: mount}})
	return string(b)
}

// TestHostMountValidation: in CubeSandbox mode host-mount is checked like
// CubeAPI checks it (an array of entries with absolute paths, host paths
// under the allowed prefix, symbolic links included), and what the fake
// cannot do is refused rather than faked; at E2B it is plain metadata.
func TestHostMountValidation(t *testing.T) {
	t.Parallel()
	prefix := t.TempDir()
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(prefix, "escape")); err != nil {
		t.Fatal(err)
	}
	cube := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}, CubeSandbox: true, HostMountPrefix: prefix})
	e2b := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
	in := func(p string) string { return filepath.Join(prefix, p) }
	entry := func(host, mount string, ro bool) string {
		b, _ := json.Marshal([]map[string]any{{"hostPath": host, "mountPath": mount, "readOnly": ro}})
		return string(b)
	}
	cases := []struct {
		name  string
		f     *e2bfake.Server
		mount string
		want  int
		msg   string
	}{
		{"valid", cube, entry(in("a/1"), in("a/1"), false), 201, ""},
		{"empty array", cube, `[]`, 201, ""},
		{"not JSON", cube, `/data/shared/x`, 400, "JSON array"},
		{"an object", cube, `{"hostPath":"` + in("x") + `"}`, 400, "JSON array"},
		{"unknown field", cube, `[{"hostPath":"` + in("x") + `","mountPath":"` + in("x") + `","rw":true}]`, 400, "JSON array"},
		{"relative host path", cube, entry("a/1", "/w", false), 400, "absolute, clean"},
		{"unclean host path", cube, entry(prefix+"/a/../../etc", "/w", false), 400, "absolute, clean"},
		{"outside the prefix", cube, entry(outside, outside, false), 400, "not under an allowed prefix"},
		{"the prefix's sibling", cube, entry(prefix+"-other/x", prefix+"-other/x", false), 400, "not under an allowed prefix"},
		{"symlink out", cube, entry(in("escape/x"), in("escape/x"), false), 400, "leads outside the allowed prefix"},
		{"relative mount path", cube, entry(in("b"), "w", false), 400, "absolute, clean"},
		{"two mounts", cube, `[{"hostPath":"` + in("c") + `","mountPath":"` + in("c") + `"},{"hostPath":"` + in("d") + `","mountPath":"` + in("d") + `"}]`, 400, "one directory"},
		{"read only", cube, entry(in("e"), in("e"), true), 400, "read-only"},
		{"another mount path", cube, entry(in("f"), "/workspace", false), 400, "at its host path"},
		{"E2B keeps it as metadata", e2b, entry(outside, "/w", true), 201, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, _, v := raw(t, "POST", tc.f.URL()+"/sandboxes", "application/json", createWithMount(tc.mount))
			if st != tc.want {
				t.Fatalf("status %d (%v), want %d", st, v, tc.want)
			}
			m, _ := v.(map[string]any)
			if msg, _ := m["message"].(string); tc.msg != "" && (!strings.Contains(msg, tc.msg) || m["code"] != float64(400)) {
				t.Errorf("answer %v, want code 400 and a message with %q", v, tc.msg)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); !os.IsNotExist(err) {
		t.Errorf("a refused mount created a directory outside the prefix: %v", err)
	}
}

// TestHostMountOutlivesSandbox: with a real agentd, the sandbox works in
// the mounted host directory (created when missing); a file written there
// survives the sandbox's kill and is seen by the next sandbox mounting it.
func TestHostMountOutlivesSandbox(t *testing.T) {
	t.Parallel()
	prefix := t.TempDir()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{CubeSandbox: true, HostMountPrefix: prefix})
	dir := filepath.Join(prefix, "acme", "7")
	mount := `[{"hostPath":"` + dir + `","mountPath":"` + dir + `","readOnly":false}]`
	ctx := context.Background()
	runIn := func(id, cmd string) string {
		t.Helper()
		c := agentd.NewClient(f.ProxyURL()+"/sandbox/"+id+"/49984", e2bfaketest.Token, &http.Client{Timeout: 30 * time.Second})
		res, err := c.Run(ctx, agentd.CreateSessionRequest{Command: cmd, Cwd: dir, WaitMS: 10_000})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("run %q in %s: %v %+v", cmd, id, err, res)
		}
		return string(res.Stdout)
	}
	first := newID(t, f.URL(), createWithMount(mount))
	if snap, _ := f.Inspect(first); snap.Workspace != dir {
		t.Errorf("workspace = %q, want the mounted %q", snap.Workspace, dir)
	}
	if got := runIn(first, "echo kept > notes.txt && pwd"); strings.TrimSpace(got) != dir {
		t.Errorf("pwd = %q, want %q", got, dir)
	}
	if st, _, v := raw(t, "DELETE", f.URL()+"/sandboxes/"+first, "", ""); st != http.StatusNoContent {
		t.Fatalf("kill: %d %v", st, v)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "notes.txt")); err != nil || string(b) != "kept\n" {
		t.Fatalf("after the kill the host file is %q, %v", b, err)
	}
	second := newID(t, f.URL(), createWithMount(mount))
	if second == first {
		t.Fatal("the second sandbox has the first one's id")
	}
	if got := runIn(second, "cat notes.txt"); got != "kept\n" {
		t.Errorf("the next sandbox reads %q", got)
	}
}
