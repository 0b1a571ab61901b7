//go:build linux

package agentd

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// removeCgroupTree removes an agentd cgroup and its (empty) session
// cgroups. Populated cgroups cannot be removed; the error says so.
func removeCgroupTree(dir string) error {
	subs, _ := filepath.Glob(filepath.Join(dir, "*", "cgroup.procs"))
	for _, sub := range subs {
		os.Remove(filepath.Dir(sub))
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// removeStale removes the cgroups of agentd processes that no longer
// exist (killed before they could clean up), so they do not pile up.
// Cgroups still holding processes are left alone.
func removeStale(parent string) {
	dirs, _ := filepath.Glob(filepath.Join(parent, "agentd-*-*"))
	for _, dir := range dirs {
		pid, err := strconv.Atoi(strings.Split(filepath.Base(dir), "-")[1])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			removeCgroupTree(dir)
		}
	}
}

// setupCgroup creates the cgroup that holds the sessions' cgroups: below
// parent, or below agentd's own cgroup.
func setupCgroup(parent string, limits cgroupLimits) (string, error) {
	if parent == "" {
		own, err := ownCgroup()
		if err != nil {
			return "", err
		}
		parent = own
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(parent, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", parent, err)
	}
	if st.Type != cgroup2Magic {
		return "", fmt.Errorf("%s is not a cgroup v2 directory", parent)
	}
	removeStale(parent)
	dir := filepath.Join(parent, fmt.Sprintf("agentd-%d-%s", os.Getpid(), newSessionID()[:8]))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		os.Remove(dir)
		return "", fmt.Errorf("%s has no cgroup.kill (Linux 5.14 or later is needed): %w", dir, err)
	}
	if err := enableControllers(parent, dir, limits); err != nil {
		os.Remove(dir)
		return "", err
	}
	return dir, nil
}

const cgroup2Magic = 0x63677270

// ownCgroup finds agentd's own cgroup v2 directory.
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	var rel string
	found := false
	for line := range strings.Lines(string(b)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			rel, found = p, true
		}
	}
	if !found {
		return "", errors.New("agentd is in no cgroup v2")
	}
	mount, root, err := cgroup2Mount()
	if err != nil {
		return "", err
	}
	r, err := filepath.Rel(root, rel)
	if err != nil || strings.HasPrefix(r, "..") {
		return "", fmt.Errorf("agentd's cgroup %s is outside the mounted cgroup2 tree", rel)
	}
	return filepath.Join(mount, r), nil
}

// cgroup2Mount finds the cgroup2 mount point and the cgroup it shows.
func cgroup2Mount() (mount, root string, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		fields := strings.Fields(pre)
		if len(fields) >= 5 {
			return unescapeMount(fields[4]), unescapeMount(fields[3]), nil
		}
	}
	return "", "", errors.New("no cgroup2 file system is mounted")
}

// unescapeMount undoes mountinfo's octal escapes of spaces and the like.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// enableControllers makes the memory and pids controllers available to the
// session cgroups when limits ask for them. A cgroup with processes of its
// own cannot pass controllers down, so when agentd's own cgroup refuses,
// agentd moves itself into a leaf below dir first.
func enableControllers(parent, dir string, limits cgroupLimits) error {
	var want []string
	if limits.memoryMax > 0 {
		want = append(want, "+memory")
	}
	if limits.pidsMax > 0 {
		want = append(want, "+pids")
	}
	if len(want) == 0 {
		return nil
	}
	ctl := []byte(strings.Join(want, " "))
	err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), ctl, 0)
	if errors.Is(err, syscall.EBUSY) {
		leaf := filepath.Join(dir, "agentd")
		if err := os.Mkdir(leaf, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", leaf, err)
		}
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return fmt.Errorf("move agentd into %s: %w", leaf, err)
		}
		err = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), ctl, 0)
	}
	if err != nil {
		return fmt.Errorf("enable %s in %s (are the controllers delegated to agentd's cgroup?): %w", ctl, parent, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), ctl, 0); err != nil {
		return fmt.Errorf("enable %s in %s: %w", ctl, dir, err)
	}
	return nil
}
