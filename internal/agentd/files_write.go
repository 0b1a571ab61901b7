package agentd

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// writeLimits bound what one write, archive or copy may put on disk.
type writeLimits struct {
	maxBytes    int64 // body of PUT /v1/files and PUT /v1/files/archive
	unpackBytes int64 // total bytes unpacked from one archive or copied by one copy
	unpackFiles int   // entries of one archive or copy
}

// Default file modes of writes that name none.
const (
	defaultFileMode fs.FileMode = 0o644
	defaultDirMode  fs.FileMode = 0o755
)

// parseMode reads an octal permission such as "0644"; "" is the default.
// Only permission bits are accepted: setuid, setgid and sticky bits set by
// a caller over the network are not wanted in a workspace.
func parseMode(s string) (fs.FileMode, error) {
	if s == "" {
		return defaultFileMode, nil
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o777 {
		return 0, newError(CodeBadRequest, "The mode must be octal permission bits between 0000 and 0777, such as 0644.")
	}
	return fs.FileMode(v), nil
}

// parentOf opens the directory that holds p (creating it) as a root of its
// own and returns it with p's last element. Staging and swapping then use
// plain names inside that directory; opening it through the confined root
// means no component on the way there leaves the root.
func (f *fileSystem) parentOf(p string) (*os.Root, string, error) {
	if f.root == nil {
		if f.sourcesForOthers {
			// agentd is root and commands run as another user: without a
			// root, a write (a session's upload, a fetch) would be root's
			// write anywhere, /etc included.
			return nil, "", newError(CodePathOutsideRoot, "agentd runs commands as another user (--run-as) and has no --root: it writes files only below a root.")
		}
		if p == "" {
			return nil, "", newError(CodeBadRequest, "A path is required.")
		}
		if strings.IndexByte(p, 0) >= 0 {
			return nil, "", newError(CodeBadRequest, "The path contains a NUL byte.")
		}
		clean := filepath.Clean(p)
		base := filepath.Base(clean)
		if base == "." || base == string(filepath.Separator) || base == ".." {
			return nil, "", newError(CodeBadRequest, "The path %q does not name a file or directory that can be written.", p)
		}
		if err := os.MkdirAll(filepath.Dir(clean), defaultDirMode); err != nil {
			return nil, "", f.pathError(p, err)
		}
		pr, err := os.OpenRoot(filepath.Dir(clean))
		if err != nil {
			return nil, "", f.pathError(p, err)
		}
		return pr, base, nil
	}
	rel, err := f.rel(p)
	if err != nil {
		return nil, "", err
	}
	if rel == "." {
		return nil, "", newError(CodeBadRequest, "The root directory itself cannot be written or replaced.")
	}
	dir := filepath.Dir(rel)
	if err := f.root.MkdirAll(dir, defaultDirMode); err != nil {
		return nil, "", f.pathError(p, err)
	}
	pr, err := f.root.OpenRoot(dir)
	if err != nil {
		return nil, "", f.pathError(p, err)
	}
	return pr, filepath.Base(rel), nil
}

// stageName is a hidden temporary name beside base; the ".agentd-" marker
// lets an operator tell leftovers of a crash from real files.
func stageName(base, kind string) string {
	return "." + base + ".agentd-" + kind + "-" + newSessionID()[:12]
}

// hashingCopy copies at most limit bytes of r to w, hashing them. It
// reports whether r had more.
func hashingCopy(w io.Writer, r io.Reader, limit int64) (n int64, sum string, over bool, err error) {
	h := sha256.New()
	n, err = io.Copy(io.MultiWriter(w, h), io.LimitReader(r, limit+1))
	if n > limit {
		return n, "", true, nil
	}
	return n, hex.EncodeToString(h.Sum(nil)), false, err
}

// writeFile stores body (at most maxBytes) at p with mode. The bytes go to
// a temporary file beside p that is renamed over p only once complete and
// closed, so a body cut off mid-way never appears under p.
func (f *fileSystem) writeFile(p string, mode fs.FileMode, body io.Reader, maxBytes int64) (*WriteResponse, error) {
	pr, base, err := f.parentOf(p)
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	if fi, err := pr.Stat(base); err == nil && fi.IsDir() {
		return nil, newError(CodeIsDirectory, "The path %q is a directory.", p)
	}
	tmp := stageName(base, "put")
	file, err := pr.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, f.pathError(p, err)
	}
	n, sum, over, copyErr := hashingCopy(file, body, maxBytes)
	if copyErr == nil && !over {
		copyErr = file.Chmod(mode)
	}
	closeErr := file.Close()
	switch {
	case over:
		pr.Remove(tmp)
		return nil, newError(CodeTooLarge, "The body exceeds the write limit of %d bytes.", maxBytes)
	case copyErr != nil:
		pr.Remove(tmp)
		return nil, bodyError(copyErr, n)
	case closeErr != nil:
		pr.Remove(tmp)
		return nil, fmt.Errorf("agentd: close %s: %w", tmp, closeErr)
	}
	if err := pr.Rename(tmp, base); err != nil {
		pr.Remove(tmp)
		return nil, f.pathError(p, err)
	}
	return &WriteResponse{Path: p, Size: n, SHA256: sum}, nil
}

// bodyError reports a request body that could not be read to its end:
// the client went away or sent less than it announced.
func bodyError(err error, n int64) error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return newError(CodeBadRequest, "The body ended after %d bytes, before it was complete; nothing was written.", n)
}

// writeArchive spools body (at most maxBytes) beside dir, hashing it,
// and unpacks it into dir (see unpackInto).
func (f *fileSystem) writeArchive(dir, format string, body io.Reader, lim writeLimits) (*WriteResponse, error) {
	if err := checkFormat(format); err != nil {
		return nil, err
	}
	pr, base, err := f.parentOf(dir)
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	spool := stageName(base, "arc")
	file, err := pr.OpenFile(spool, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, f.pathError(dir, err)
	}
	defer pr.Remove(spool)
	defer file.Close()
	n, sum, over, err := hashingCopy(file, body, lim.maxBytes)
	switch {
	case over:
		return nil, newError(CodeTooLarge, "The archive exceeds the write limit of %d bytes.", lim.maxBytes)
	case err != nil:
		return nil, bodyError(err, n)
	}
	files, err := unpackInto(pr, base, dir, file, n, format, lim)
	if err != nil {
		return nil, err
	}
	return &WriteResponse{Path: dir, Size: n, SHA256: sum, Files: files}, nil
}

func checkFormat(format string) error {
	if format != ArchiveTarGz && format != ArchiveZip {
		return newError(CodeBadRequest, "The archive format must be %q or %q.", ArchiveTarGz, ArchiveZip)
	}
	return nil
}

// unpackInto unpacks the archive in file into a new directory beside base
// (inside pr), then swaps it in for base: a half-unpacked tree never
// appears under base's name. An existing directory at base is replaced
// and removed; anything else there is refused.
func unpackInto(pr *os.Root, base, display string, file *os.File, size int64, format string, lim writeLimits) (int, error) {
	if fi, err := pr.Lstat(base); err == nil && !fi.IsDir() {
		return 0, newError(CodeBadRequest, "The path %q exists and is not a directory; an archive unpacks into a directory.", display)
	}
	stage := stageName(base, "dir")
	if err := pr.Mkdir(stage, defaultDirMode); err != nil {
		return 0, fmt.Errorf("agentd: stage %s: %w", stage, err)
	}
	dst, err := pr.OpenRoot(stage)
	if err != nil {
		pr.RemoveAll(stage)
		return 0, fmt.Errorf("agentd: stage %s: %w", stage, err)
	}
	t := newTreeWriter(dst, lim)
	if format == ArchiveZip {
		err = unpackZip(t, file, size)
	} else {
		err = unpackTarGz(t, file)
	}
	if err == nil {
		err = t.finish()
	}
	dst.Close()
	if err != nil {
		pr.RemoveAll(stage)
		return 0, err
	}
	if err := swapDir(pr, stage, base, display); err != nil {
		pr.RemoveAll(stage)
		return 0, err
	}
	return t.files, nil
}

// swapDir renames stage to base, moving an existing directory at base
// aside first and removing it after.
func swapDir(pr *os.Root, stage, base, display string) error {
	fi, err := pr.Lstat(base)
	if errors.Is(err, fs.ErrNotExist) {
		if err := pr.Rename(stage, base); err != nil {
			return fmt.Errorf("agentd: rename into %s: %w", display, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("agentd: examine %s: %w", display, err)
	}
	if !fi.IsDir() {
		return newError(CodeBadRequest, "The path %q exists and is not a directory.", display)
	}
	old := stageName(base, "old")
	if err := pr.Rename(base, old); err != nil {
		return fmt.Errorf("agentd: move %s aside: %w", display, err)
	}
	if err := pr.Rename(stage, base); err != nil {
		pr.Rename(old, base)
		return fmt.Errorf("agentd: rename into %s: %w", display, err)
	}
	pr.RemoveAll(old)
	return nil
}

// treeWriter creates the entries of an archive or a copied tree inside
// dst, counting entries and bytes against the limits (an archive's headers
// are not trusted: bytes are counted as they are written). Directories are
// created writable and given their own modes at the end, so a read-only
// directory early in an archive does not stop its contents.
type treeWriter struct {
	dst      *os.Root
	lim      writeLimits
	files    int
	tops     int // entries naming the top directory itself
	bytes    int64
	dirModes map[string]fs.FileMode
	// hashing collects entries for the tree hash (copies only).
	hashing bool
	entries []treeEntry
	// links are the symlinks made, resolved again once the tree is
	// complete (see checkLinks).
	links []string
	// decompressed is how many bytes a tar.gz decompressed to, headers
	// included (bounded by unpackReader).
	decompressed int64
}

// treeEntry is one line of a tree hash.
type treeEntry struct{ path, kind, detail string }

func newTreeWriter(dst *os.Root, lim writeLimits) *treeWriter {
	return &treeWriter{dst: dst, lim: lim, dirModes: make(map[string]fs.FileMode)}
}

func (t *treeWriter) count(name string) error {
	t.files++
	return t.checkEntries(name)
}

// top counts an entry naming the tree's top directory (nothing to
// create, not among the files answered) toward the entry limit.
func (t *treeWriter) top(name string) error {
	t.tops++
	return t.checkEntries(name)
}

func (t *treeWriter) checkEntries(name string) error {
	if t.files+t.tops > t.lim.unpackFiles {
		return newError(CodeTooLarge, "The tree has more than %d entries (at %q).", t.lim.unpackFiles, name)
	}
	return nil
}

func (t *treeWriter) parent(name string) error {
	if dir := filepath.Dir(name); dir != "." {
		if err := t.dst.MkdirAll(dir, defaultDirMode); err != nil {
			return t.entryError(name, err)
		}
	}
	return nil
}

func (t *treeWriter) entryError(name string, err error) error {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, fs.ErrExist):
		return newError(CodeBadRequest, "The entry %q appears twice.", name)
	case leavesRoot(err):
		return newError(CodePathOutsideRoot, "The entry %q leads outside its directory.", name)
	case isNotDir(err):
		return newError(CodeBadRequest, "The entry %q lies below something that is not a directory.", name)
	default:
		return fmt.Errorf("agentd: write entry %s: %w", name, err)
	}
}

// leavesRoot reports an os.Root refusing a path because following it
// leaves the root (or loops); os.Root has no sentinel error for either.
func leavesRoot(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "escapes") || strings.Contains(msg, "too many levels of symbolic links")
}

func (t *treeWriter) dir(name string, mode fs.FileMode) error {
	if err := t.count(name); err != nil {
		return err
	}
	if err := t.dst.MkdirAll(name, defaultDirMode); err != nil {
		return t.entryError(name, err)
	}
	if mode.Perm() == 0 {
		mode = defaultDirMode
	}
	t.dirModes[name] = mode.Perm()
	t.note(name, "dir", "")
	return nil
}

func (t *treeWriter) file(name string, mode fs.FileMode, r io.Reader) error {
	if err := t.count(name); err != nil {
		return err
	}
	if err := t.parent(name); err != nil {
		return err
	}
	w, err := t.dst.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return t.entryError(name, err)
	}
	room := t.lim.unpackBytes - t.bytes
	n, sum, over, copyErr := hashingCopy(w, r, room)
	t.bytes += n
	if mode.Perm() == 0 {
		mode = defaultFileMode
	}
	if copyErr == nil && !over {
		copyErr = w.Chmod(mode.Perm())
	}
	closeErr := w.Close()
	switch {
	case over:
		return newError(CodeTooLarge, "The tree holds more than %d bytes (at %q).", t.lim.unpackBytes, name)
	case copyErr != nil:
		var e *Error
		if errors.As(copyErr, &e) {
			return e
		}
		return newError(CodeBadRequest, "The entry %q could not be read: %s.", name, strings.TrimSuffix(copyErr.Error(), "."))
	case closeErr != nil:
		return fmt.Errorf("agentd: close entry %s: %w", name, closeErr)
	}
	t.note(name, "file", sum)
	return nil
}

func (t *treeWriter) symlink(name, target string) error {
	if err := t.count(name); err != nil {
		return err
	}
	if err := checkLinkTarget(name, target); err != nil {
		return err
	}
	if err := t.parent(name); err != nil {
		return err
	}
	if err := t.dst.Symlink(target, name); err != nil {
		return t.entryError(name, err)
	}
	t.links = append(t.links, name)
	t.note(name, "symlink", target)
	return nil
}

func (t *treeWriter) hardlink(name, target string) error {
	if err := t.count(name); err != nil {
		return err
	}
	// A symlink's target is relative to where it stands: linked
	// elsewhere it could point out of the tree.
	if fi, err := t.dst.Lstat(target); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return newError(CodeBadRequest, "The hard link %q names the symbolic link %q; that is refused.", name, target)
	}
	if err := t.parent(name); err != nil {
		return err
	}
	if err := t.dst.Link(target, name); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return newError(CodeBadRequest, "The hard link %q names %q, which is not earlier in the archive.", name, target)
		}
		return t.entryError(name, err)
	}
	return nil
}

func (t *treeWriter) note(name, kind, detail string) {
	if t.hashing {
		t.entries = append(t.entries, treeEntry{filepath.ToSlash(name), kind, detail})
	}
}

// finish gives directories their modes, deepest first so that a
// directory without write permission is changed after its children.
func (t *treeWriter) finish() error {
	if err := t.checkLinks(); err != nil {
		return err
	}
	names := make([]string, 0, len(t.dirModes))
	for n := range t.dirModes {
		names = append(names, n)
	}
	// A longer path is deeper or a sibling; siblings take any order.
	slices.SortFunc(names, func(a, b string) int { return len(b) - len(a) })
	for _, n := range names {
		if err := t.dst.Chmod(n, t.dirModes[n]); err != nil {
			return fmt.Errorf("agentd: chmod %s: %w", n, err)
		}
	}
	return nil
}

// checkLinks resolves every symlink of the complete tree inside it.
// checkLinkTarget reads a target as text, but ".." after a symlink goes
// up from where that link leads, not from where it stands: with
// "deep/up" -> "..", the targets "y/.." (y -> "deep/up") and a link
// stored as "deep/up/l" -> "../x" read as inside yet lead out. The root
// the tree is built in refuses such a resolution, so a link it cannot
// follow without leaving (or only through a loop) is refused. A link to
// nothing (not yet existing) is kept.
func (t *treeWriter) checkLinks() error {
	for _, name := range t.links {
		_, err := t.dst.Stat(name)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if leavesRoot(err) {
			return newError(CodePathOutsideRoot, "The symbolic link %q leads outside its directory.", name)
		}
	}
	return nil
}

// treeHash is the documented digest of a tree: SHA-256 over, for every
// entry sorted by its slash-separated path (byte order), the line
// "<path> NUL <kind> NUL <detail> LF", where kind is file, dir or
// symlink and detail is the file's hex SHA-256, empty, or the link target.
func treeHash(entries []treeEntry) string {
	sorted := append([]treeEntry(nil), entries...)
	slices.SortFunc(sorted, func(a, b treeEntry) int { return strings.Compare(a.path, b.path) })
	h := sha256.New()
	for _, e := range sorted {
		writeTreeLine(h, e)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func writeTreeLine(h hash.Hash, e treeEntry) {
	io.WriteString(h, e.path)
	h.Write([]byte{0})
	io.WriteString(h, e.kind)
	h.Write([]byte{0})
	io.WriteString(h, e.detail)
	h.Write([]byte{'\n'})
}
