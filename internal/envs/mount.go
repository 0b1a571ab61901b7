package envs

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// Placeholders of a workspace mount template.
const (
	PlaceholderOrg     = "{org}"
	PlaceholderSession = "{session}"
)

// maxPathLen bounds a stored path: a workspace root, a mount template or
// a mount path.
const maxPathLen = 1024

// Mount is one session's persistent workspace: a directory on the
// backend's hosts (an NFS export, say) and where it appears inside the
// sandbox.
type Mount struct {
	HostPath  string
	MountPath string
}

// validateMount checks and cleans a sandbox environment's workspace mount
// template and mount path, adding field errors to v.
func validateMount(v *apperr.ValidationError, e *Environment, prefix string) {
	if e.WorkspaceMount == "" {
		if e.WorkspaceMountPath != "" {
			v.Add("workspace_mount_path", "A mount path needs a workspace mount (host path template) to mount.")
		}
		return
	}
	tpl, msg := cleanMountTemplate(e.WorkspaceMount, prefix)
	if msg != "" {
		v.Add("workspace_mount", "%s", msg)
	}
	e.WorkspaceMount = tpl
	if e.WorkspaceMountPath != "" {
		mp, msg := cleanMountPath(e.WorkspaceMountPath)
		if msg != "" {
			v.Add("workspace_mount_path", "%s", msg)
		}
		e.WorkspaceMountPath = mp
	}
}

// checkPath refuses p when it is longer than maxPathLen, holds a control
// character or has a ".." element; backslash says whether a backslash
// separates elements (Windows paths) or is refused. A ".." is refused
// rather than resolved: what someone typing "/data/shared/../../etc"
// meant is not /etc. It returns p's elements other than "" and ".".
func checkPath(p, example string, backslash bool) ([]string, string) {
	if len(p) > maxPathLen {
		return nil, fmt.Sprintf("%s, at most %d characters.", example, maxPathLen)
	}
	refused := example + ", without control characters."
	if !backslash {
		refused = example + ", without control characters or backslashes."
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f || !backslash && r == '\\' {
			return nil, refused
		}
	}
	var elems []string
	for _, el := range strings.FieldsFunc(p, func(r rune) bool { return r == '/' || backslash && r == '\\' }) {
		switch el {
		case "..":
			return nil, example + ", without \"..\" elements."
		case ".":
		default:
			elems = append(elems, el)
		}
	}
	return elems, ""
}

// cleanAbsolute returns p, absolute, in clean form, or why it is refused
// (checkPath's refusals; backslashes too, which no sandbox path needs).
func cleanAbsolute(p, example string) (string, string) {
	if _, msg := checkPath(p, example, false); msg != "" {
		return p, msg
	}
	if !strings.HasPrefix(p, "/") {
		return p, example + "."
	}
	return path.Clean(p), ""
}

// cleanMountTemplate checks a host path template: absolute, no "..",
// only the {org} and {session} placeholders, {session} present (one
// directory per session, never shared between sessions), and under prefix.
func cleanMountTemplate(p, prefix string) (string, string) {
	example := "The workspace mount must be an absolute host path template under " + prefix +
		" with a {session} placeholder, like " + strings.TrimSuffix(prefix, "/") + "/{org}/{session}"
	clean, msg := cleanAbsolute(p, example)
	if msg != "" {
		return clean, msg
	}
	bare := strings.NewReplacer(PlaceholderOrg, "", PlaceholderSession, "").Replace(clean)
	if strings.ContainsAny(bare, "{}") {
		return clean, example + "; {org} and {session} are the only placeholders."
	}
	if !strings.Contains(clean, PlaceholderSession) {
		return clean, example + ": without {session} every session would share one directory."
	}
	if !strings.HasPrefix(clean, strings.TrimSuffix(prefix, "/")+"/") {
		return clean, example + ": the backend mounts host paths under its allowed prefix only."
	}
	return clean, ""
}

// cleanMountPath checks the path inside the sandbox.
func cleanMountPath(p string) (string, string) {
	const example = "The mount path must be an absolute path inside the sandbox, like /workspace"
	clean, msg := cleanAbsolute(p, example)
	switch {
	case msg != "":
		return clean, msg
	case clean == "/":
		return clean, example + ", not the sandbox's root."
	case strings.ContainsAny(clean, "{}"):
		return clean, example + ", without placeholders."
	}
	return clean, ""
}

// WorkspaceMountFor is the persistent workspace of session id in org, and
// false when the environment mounts none. The org slug and the id fill
// the placeholders; a slug that could leave the template's directory is
// refused (slugs never can, but the path is given to another system).
func (e Environment) WorkspaceMountFor(org string, id int64) (Mount, bool, error) {
	if e.WorkspaceMount == "" {
		return Mount{}, false, nil
	}
	if org == "" || org == "." || org == ".." || strings.ContainsAny(org, "/\\{}") {
		return Mount{}, false, fmt.Errorf("org slug %q cannot name a directory", org)
	}
	host := strings.NewReplacer(PlaceholderOrg, org, PlaceholderSession, strconv.FormatInt(id, 10)).Replace(e.WorkspaceMount)
	if path.Clean(host) != host {
		return Mount{}, false, fmt.Errorf("workspace mount %q of environment %d does not expand to a clean path", e.WorkspaceMount, e.ID)
	}
	m := Mount{HostPath: host, MountPath: e.WorkspaceMountPath}
	if m.MountPath == "" {
		m.MountPath = host
	}
	return m, true, nil
}
