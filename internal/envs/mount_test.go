package envs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestWorkspaceMountValidation is the rule table of a sandbox
// environment's workspace mount: an absolute template under the allowed
// prefix with a {session} placeholder and no other, no "..", stored in
// clean form; an optional absolute mount path; nothing of it on a host.
func TestWorkspaceMountValidation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		kind      string
		mount     string
		mountPath string
		field     string // "" means valid
		want      string // the error's text, or the stored template when valid
		wantPath  string // the stored mount path when valid
	}{
		{"none", envs.KindSandbox, "", "", "", "", ""},
		{"org and session", envs.KindSandbox, "/data/shared/{org}/{session}", "", "", "/data/shared/{org}/{session}", ""},
		{"session inside an element", envs.KindSandbox, "/data/shared/ws-{session}", "/workspace", "", "/data/shared/ws-{session}", "/workspace"},
		{"cleaned", envs.KindSandbox, " /data//shared/./{org}/{session}/ ", "/workspace/", "", "/data/shared/{org}/{session}", "/workspace"},
		{"relative", envs.KindSandbox, "data/shared/{session}", "", "workspace_mount", "absolute host path template", ""},
		{"dot dot", envs.KindSandbox, "/data/shared/../../etc/{session}", "", "workspace_mount", `without ".." elements`, ""},
		{"dot dot after the placeholder", envs.KindSandbox, "/data/shared/{session}/..", "", "workspace_mount", `".."`, ""},
		{"no session", envs.KindSandbox, "/data/shared/{org}", "", "workspace_mount", "every session would share one directory", ""},
		{"unknown placeholder", envs.KindSandbox, "/data/shared/{user}/{session}", "", "workspace_mount", "only placeholders", ""},
		{"stray brace", envs.KindSandbox, "/data/shared/{session", "", "workspace_mount", "only placeholders", ""},
		{"outside the prefix", envs.KindSandbox, "/srv/nfs/{session}", "", "workspace_mount", "allowed prefix", ""},
		{"prefix without its slash", envs.KindSandbox, "/data/shared{session}", "", "workspace_mount", "allowed prefix", ""},
		{"placeholder in the prefix", envs.KindSandbox, "/data/{org}/{session}", "", "workspace_mount", "allowed prefix", ""},
		{"control character", envs.KindSandbox, "/data/shared/\x01/{session}", "", "workspace_mount", "without control characters", ""},
		{"backslash", envs.KindSandbox, `/data/shared\{session}`, "", "workspace_mount", "backslashes", ""},
		{"too long", envs.KindSandbox, "/data/shared/{session}/" + strings.Repeat("a", 1024), "", "workspace_mount", "at most 1024 characters", ""},
		{"mount path relative", envs.KindSandbox, "/data/shared/{session}", "workspace", "workspace_mount_path", "absolute path inside the sandbox", ""},
		{"mount path root", envs.KindSandbox, "/data/shared/{session}", "/", "workspace_mount_path", "not the sandbox's root", ""},
		{"mount path dot dot", envs.KindSandbox, "/data/shared/{session}", "/work/../etc", "workspace_mount_path", `".."`, ""},
		{"mount path placeholder", envs.KindSandbox, "/data/shared/{session}", "/w/{session}", "workspace_mount_path", "without placeholders", ""},
		{"mount path alone", envs.KindSandbox, "", "/workspace", "workspace_mount_path", "needs a workspace mount", ""},
		{"host with a mount", envs.KindHost, "/data/shared/{session}", "", "workspace_mount", "for sandbox environments", ""},
	}
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				name := fmt.Sprintf("m-%d", i)
				in := sandboxInput(name, "https://api.e2b.app", "e2b.app", token("m"), "")
				if tc.kind == envs.KindHost {
					in = hostInput(name, "https://build-01:49984", token("m"))
				}
				in.WorkspaceMount, in.WorkspaceMountPath = ptr(tc.mount), ptr(tc.mountPath)
				e, err := f.envs.Create(context.Background(), sys, in)
				if tc.field != "" {
					wantField(t, err, tc.field, tc.want)
					return
				}
				if err != nil {
					t.Fatalf("valid mount refused: %v", err)
				}
				got, err := f.envs.Get(context.Background(), sys, e.ID)
				if err != nil {
					t.Fatal(err)
				}
				if got.WorkspaceMount != tc.want || got.WorkspaceMountPath != tc.wantPath {
					t.Errorf("stored (%q, %q), want (%q, %q)", got.WorkspaceMount, got.WorkspaceMountPath, tc.want, tc.wantPath)
				}
			})
		}
	})
}

// TestWorkspaceMountUpdate: the mount is set, changed and removed by
// Update (nil leaves it alone), and the service's prefix is the one
// enforced.
func TestWorkspaceMountUpdate(t *testing.T) {
	t.Parallel()
	f := setup(t, store.SQLite)
	ctx := context.Background()
	e := f.mustCreate(t, sandboxInput("s", "https://api.e2b.app", "e2b.app", token("s"), ""))
	steps := []struct {
		name            string
		mount, path     *string
		wantM, wantPath string
	}{
		{"set", ptr("/data/shared/{org}/{session}"), nil, "/data/shared/{org}/{session}", ""},
		{"left alone", nil, nil, "/data/shared/{org}/{session}", ""},
		{"mount path added", nil, ptr("/workspace"), "/data/shared/{org}/{session}", "/workspace"},
		{"removed", ptr(""), ptr(""), "", ""},
	}
	for _, st := range steps {
		_, got, err := f.envs.Update(ctx, sys, e.ID, envs.Input{WorkspaceMount: st.mount, WorkspaceMountPath: st.path})
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got, err = f.envs.Get(ctx, sys, got.ID); err != nil {
			t.Fatal(err)
		}
		if got.WorkspaceMount != st.wantM || got.WorkspaceMountPath != st.wantPath {
			t.Errorf("%s: stored (%q, %q), want (%q, %q)", st.name, got.WorkspaceMount, got.WorkspaceMountPath, st.wantM, st.wantPath)
		}
	}
	other := *f.envs
	other.MountPrefix = "/srv/nfs/"
	if _, _, err := other.Update(ctx, sys, e.ID, envs.Input{WorkspaceMount: ptr("/srv/nfs/{session}")}); err != nil {
		t.Errorf("a template under the service's own prefix refused: %v", err)
	}
	_, _, err := other.Update(ctx, sys, e.ID, envs.Input{WorkspaceMount: ptr("/data/shared/{session}")})
	wantField(t, err, "workspace_mount", "under /srv/nfs/")
}

// TestWorkspaceMountFor: the placeholders are filled with the org slug and
// the session id; the mount path defaults to the host path; a slug that
// could leave the directory is refused.
func TestWorkspaceMountFor(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, mount, mountPath, org string
		want                        envs.Mount
		ok                          bool
		err                         string
	}{
		{"none", "", "", "acme", envs.Mount{}, false, ""},
		{"same path", "/data/shared/{org}/{session}", "", "acme", envs.Mount{HostPath: "/data/shared/acme/42", MountPath: "/data/shared/acme/42"}, true, ""},
		{"own mount path", "/data/shared/s-{session}", "/workspace", "acme", envs.Mount{HostPath: "/data/shared/s-42", MountPath: "/workspace"}, true, ""},
		{"slug with a slash", "/data/shared/{org}/{session}", "", "a/b", envs.Mount{}, false, "cannot name a directory"},
		{"slug dot dot", "/data/shared/{org}/{session}", "", "..", envs.Mount{}, false, "cannot name a directory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := envs.Environment{ID: 1, Kind: envs.KindSandbox, WorkspaceMount: tc.mount, WorkspaceMountPath: tc.mountPath}
			m, ok, err := e.WorkspaceMountFor(tc.org, 42)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || ok != tc.ok || m != tc.want {
				t.Errorf("= %+v, %v, %v; want %+v, %v", m, ok, err, tc.want, tc.ok)
			}
		})
	}
}
