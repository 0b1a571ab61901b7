// Package release holds the agentd builds the console offers for download
// (GET /downloads/agentd/...), so a host needs no Go toolchain to run
// agentd: the console's own binary for its own platform (it runs as agentd
// under that name), and for other platforms the files of a directory of
// release builds named agentd-<os>-<arch>, with .exe for Windows, as
// scripts/release-agentd writes them.
package release

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

// Standard are the platforms a release builds, in the order the connect
// page lists them; it offers a command for each, or says it cannot.
var Standard = []string{"linux-amd64", "linux-arm64", "darwin-arm64", "windows-amd64"}

// ErrUnknownPlatform is returned for a platform with no build.
var ErrUnknownPlatform = errors.New("no agentd build for this platform")

// Build is one downloadable agentd.
type Build struct {
	// Platform is <os>-<arch> as Go names them: linux-amd64.
	Platform string
	Path     string
	Size     int64
	// SHA256 is the file's hash in hex.
	SHA256 string
}

// FileName is what the build is saved as: agentd, or agentd.exe for
// Windows.
func (b Build) FileName() string { return FileName(b.Platform) }

// FileName is agentd's file name on platform.
func FileName(platform string) string {
	if strings.HasPrefix(platform, "windows-") {
		return "agentd.exe"
	}
	return "agentd"
}

// DirName is the file name of platform's build in a release directory.
func DirName(platform string) string {
	name := "agentd-" + platform
	if strings.HasPrefix(platform, "windows-") {
		name += ".exe"
	}
	return name
}

var dirFile = regexp.MustCompile(`^agentd-([a-z0-9]+-[a-z0-9]+)(\.exe)?$`)

// Catalog finds the builds and hashes each file once: a file is hashed
// again only when its size or modification time changes.
type Catalog struct {
	// Self is a binary that runs as agentd for SelfPlatform ("" for none):
	// the console's own executable, which is agentd under that name.
	Self string
	// SelfPlatform defaults to the running platform.
	SelfPlatform string
	// Dir holds release builds for other platforms ("" for none). A
	// build there for SelfPlatform is served instead of Self.
	Dir string

	mu     sync.Mutex
	hashes map[string]hashed
}

type hashed struct {
	size    int64
	modTime time.Time
	sum     string
}

// Builds lists the available builds by platform name.
func (c *Catalog) Builds() ([]Build, error) {
	paths := map[string]string{}
	if c.Self != "" {
		paths[c.selfPlatform()] = c.Self
	}
	if c.Dir != "" {
		entries, err := os.ReadDir(c.Dir)
		if err != nil {
			return nil, fmt.Errorf("agentd release directory: %w", err)
		}
		for _, e := range entries {
			m := dirFile.FindStringSubmatch(e.Name())
			if m == nil || e.IsDir() || (m[2] == ".exe") != strings.HasPrefix(m[1], "windows-") {
				continue
			}
			paths[m[1]] = filepath.Join(c.Dir, e.Name())
		}
	}
	builds := make([]Build, 0, len(paths))
	for _, p := range slices.Sorted(maps.Keys(paths)) {
		b, err := c.build(p, paths[p])
		if err != nil {
			return nil, err
		}
		builds = append(builds, b)
	}
	return builds, nil
}

// Find is platform's build; ErrUnknownPlatform when there is none.
func (c *Catalog) Find(platform string) (Build, error) {
	builds, err := c.Builds()
	if err != nil {
		return Build{}, err
	}
	for _, b := range builds {
		if b.Platform == platform {
			return b, nil
		}
	}
	return Build{}, ErrUnknownPlatform
}

// Sums is SHA256SUMS: a line per build in sha256sum's format, named as in
// a release directory (agentd-linux-amd64).
func Sums(builds []Build) string {
	var s strings.Builder
	for _, b := range builds {
		fmt.Fprintf(&s, "%s  %s\n", b.SHA256, DirName(b.Platform))
	}
	return s.String()
}

func (c *Catalog) selfPlatform() string {
	if c.SelfPlatform != "" {
		return c.SelfPlatform
	}
	return runtime.GOOS + "-" + runtime.GOARCH
}

// build stats path and hashes it unless its hash is known for this size
// and modification time.
func (c *Catalog) build(platform, path string) (Build, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Build{}, fmt.Errorf("agentd build for %s: %w", platform, err)
	}
	b := Build{Platform: platform, Path: path, Size: fi.Size()}
	c.mu.Lock()
	h, ok := c.hashes[path]
	c.mu.Unlock()
	if ok && h.size == fi.Size() && h.modTime.Equal(fi.ModTime()) {
		b.SHA256 = h.sum
		return b, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return Build{}, fmt.Errorf("agentd build for %s: %w", platform, err)
	}
	defer f.Close()
	sum := sha256.New()
	if _, err := io.Copy(sum, f); err != nil {
		return Build{}, fmt.Errorf("hash the agentd build for %s: %w", platform, err)
	}
	b.SHA256 = hex.EncodeToString(sum.Sum(nil))
	c.mu.Lock()
	if c.hashes == nil {
		c.hashes = map[string]hashed{}
	}
	c.hashes[path] = hashed{size: fi.Size(), modTime: fi.ModTime(), sum: b.SHA256}
	c.mu.Unlock()
	return b, nil
}

// Label is how a page names platform: "Linux x86-64".
func Label(platform string) string {
	goos, arch, _ := strings.Cut(platform, "-")
	names := map[string]string{"linux": "Linux", "darwin": "macOS", "windows": "Windows", "freebsd": "FreeBSD"}
	arches := map[string]string{"amd64": "x86-64", "arm64": "ARM64", "386": "x86", "arm": "ARM"}
	if goos == "darwin" {
		arches = map[string]string{"amd64": "Intel", "arm64": "Apple silicon"}
	}
	n, ok := names[goos]
	if !ok {
		n = goos
	}
	a, ok := arches[arch]
	if !ok {
		a = arch
	}
	return n + " " + a
}
