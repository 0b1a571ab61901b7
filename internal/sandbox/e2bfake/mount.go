package e2bfake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

// MetaHostMount is CubeSandbox's reserved metadata key: a JSON array of
// {hostPath, mountPath, readOnly} mounted into the sandbox, each host path
// under an allowed prefix. E2B has no such thing and keeps it as plain
// metadata.
const MetaHostMount = "host-mount"

// DefaultHostMountPrefix is CubeSandbox's default allowed host-mount
// prefix.
const DefaultHostMountPrefix = "/data/shared/"

// wireHostMount is one entry of the host-mount value.
type wireHostMount struct {
	HostPath  string `json:"hostPath"`
	MountPath string `json:"mountPath"`
	ReadOnly  bool   `json:"readOnly"`
}

func (s *Server) hostMountPrefix() string {
	p := s.cfg.HostMountPrefix
	if p == "" {
		p = DefaultHostMountPrefix
	}
	return strings.TrimSuffix(filepath.Clean(p), "/") + "/"
}

// parseHostMount validates a host-mount value like CubeAPI (an array of
// entries, absolute paths, host paths under the allowed prefix) and
// returns the host directory the sandbox's agentd is to work in ("" for
// an empty array).
//
// The fake's sandboxes are processes on this machine, so it cannot place
// a directory at another path, mount it read-only or mount two: it
// refuses those with a 400 that says so, rather than quietly giving the
// sandbox something other than what was asked.
func (s *Server) parseHostMount(raw string) (string, error) {
	const shape = "metadata \"host-mount\" must be a JSON array of {hostPath, mountPath, readOnly}"
	var mounts []wireHostMount
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&mounts); err != nil || dec.More() {
		return "", badf("%s.", shape)
	}
	prefix := s.hostMountPrefix()
	for _, m := range mounts {
		switch {
		case !filepath.IsAbs(m.HostPath) || filepath.Clean(m.HostPath) != m.HostPath:
			return "", badf("%s: hostPath %q must be an absolute, clean path.", shape, m.HostPath)
		case !strings.HasPrefix(m.HostPath, prefix):
			return "", badf("host-mount: hostPath %q is not under an allowed prefix (%s).", m.HostPath, prefix)
		case !filepath.IsAbs(m.MountPath) || filepath.Clean(m.MountPath) != m.MountPath:
			return "", badf("%s: mountPath %q must be an absolute, clean path.", shape, m.MountPath)
		}
	}
	switch {
	case len(mounts) == 0:
		return "", nil
	case len(mounts) > 1:
		return "", badf("host-mount: this fake backend mounts one directory per sandbox, not %d.", len(mounts))
	case mounts[0].ReadOnly:
		return "", badf("host-mount: this fake backend cannot mount read-only (its sandboxes are processes on this machine).")
	case mounts[0].MountPath != mounts[0].HostPath:
		return "", badf("host-mount: this fake backend can only mount a directory at its host path (mountPath %q, hostPath %q): its sandboxes are processes on this machine.",
			mounts[0].MountPath, mounts[0].HostPath)
	}
	return mounts[0].HostPath, nil
}

// prepareHostMount checks that the mounted directory, symbolic links
// resolved, is under the allowed prefix, and creates it if missing. The
// part that exists is checked before anything is created, so a link out of
// the prefix never gets a directory made at its target.
func (s *Server) prepareHostMount(dir string) error {
	prefix := s.hostMountPrefix()
	if err := os.MkdirAll(prefix, 0o750); err != nil {
		return statusError{http.StatusInternalServerError, fmt.Sprintf("host-mount: allowed prefix: %v", err)}
	}
	realPrefix, err := filepath.EvalSymlinks(prefix)
	if err != nil {
		return statusError{http.StatusInternalServerError, fmt.Sprintf("host-mount: allowed prefix: %v", err)}
	}
	within := func(p string) bool {
		real, err := filepath.EvalSymlinks(p)
		return err == nil && strings.HasPrefix(real+"/", strings.TrimSuffix(realPrefix, "/")+"/")
	}
	existing := dir
	for {
		if _, err := os.Lstat(existing); err == nil {
			break
		}
		existing = filepath.Dir(existing)
	}
	if !within(existing) {
		return badf("host-mount: hostPath %q leads outside the allowed prefix (%s).", dir, prefix)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return statusError{http.StatusInternalServerError, fmt.Sprintf("host-mount: cannot create %q: %v", dir, err)}
	}
	if !within(dir) {
		return badf("host-mount: hostPath %q leads outside the allowed prefix (%s).", dir, prefix)
	}
	return nil
}
