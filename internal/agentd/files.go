package agentd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// fileSystem performs file operations, confined to a root directory when one
// is configured. Confinement uses os.Root, which resolves every path
// component itself, so neither "..", absolute symlinks nor a symlink swapped
// in mid-request can lead outside.
type fileSystem struct {
	rootDir string   // absolute, symlinks resolved; "" without confinement
	root    *os.Root // nil without confinement
	// refuseLinked refuses reads of files with more than one hard link,
	// which a command may have linked to a file it cannot read itself.
	refuseLinked bool
	// sourcesForOthers makes copies read only what others may read, and
	// refuses writes without a root: set when commands run as another
	// user than agentd's (see copyIn and parentOf).
	sourcesForOthers bool
	// afterResolve, when set (by tests), runs between resolving a copy's
	// source and opening it: where a swapped-in symlink would strike.
	afterResolve func()
	// beforeEntryOpen, when set (by tests), runs between listing an entry
	// of a copied tree and opening it.
	beforeEntryOpen func(name string)
}

func newFileSystem(dir string, refuseLinked bool) (*fileSystem, error) {
	if dir == "" {
		return &fileSystem{refuseLinked: refuseLinked}, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("agentd: root: %w", err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("agentd: root: %w", err)
	}
	root, err := os.OpenRoot(real)
	if err != nil {
		return nil, fmt.Errorf("agentd: root: %w", err)
	}
	return &fileSystem{rootDir: real, root: root, refuseLinked: refuseLinked}, nil
}

// within reports whether path is dir or below it (both cleaned, absolute).
func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// rel turns a request path into one relative to the root. Absolute paths
// must lie inside the root; relative ones are taken from it.
func (f *fileSystem) rel(p string) (string, error) {
	if p == "" {
		return "", newError(CodeBadRequest, "A path is required.")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", newError(CodeBadRequest, "The path contains a NUL byte.")
	}
	if filepath.IsAbs(p) {
		clean := filepath.Clean(p)
		if !within(f.rootDir, clean) {
			return "", newError(CodePathOutsideRoot, "The path %q is outside the root directory.", p)
		}
		r, _ := filepath.Rel(f.rootDir, clean)
		return r, nil
	}
	clean := filepath.Clean(p)
	if !filepath.IsLocal(clean) && clean != "." {
		return "", newError(CodePathOutsideRoot, "The path %q is outside the root directory.", p)
	}
	return clean, nil
}

// pathError translates an os error on p into a protocol error.
func (f *fileSystem) pathError(p string, err error) error {
	var pathErr *os.PathError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return newError(CodeNotFound, "The path %q does not exist.", p)
	case errors.Is(err, fs.ErrPermission):
		return newError(CodePathOutsideRoot, "The path %q is not accessible.", p)
	case errors.As(err, &pathErr) && strings.Contains(pathErr.Err.Error(), "escapes"):
		return newError(CodePathOutsideRoot, "The path %q leads outside the root directory.", p)
	case isNotDir(err):
		return newError(CodeNotFound, "The path %q does not exist.", p)
	default:
		return newError(CodeBadRequest, "The path %q cannot be used.", p)
	}
}

func isNotDir(err error) bool {
	return err != nil && strings.Contains(err.Error(), "not a directory")
}

// openRead opens p for reading without blocking: opening a FIFO (or a
// device) that a command swapped in would otherwise wait for a writer.
func (f *fileSystem) openRead(p string) (*os.File, error) {
	flag := os.O_RDONLY | openNonblock
	if f.root == nil {
		if f.sourcesForOthers {
			// As for writes (parentOf): root's read of anything, such as
			// /etc/shadow, for a user commands run as.
			return nil, newError(CodePathOutsideRoot, "agentd runs commands as another user (--run-as) and has no --root: it reads files only below a root.")
		}
		if p == "" {
			return nil, newError(CodeBadRequest, "A path is required.")
		}
		file, err := os.OpenFile(p, flag, 0)
		if err != nil {
			return nil, f.pathError(p, err)
		}
		return file, nil
	}
	rel, err := f.rel(p)
	if err != nil {
		return nil, err
	}
	file, err := f.root.OpenFile(rel, flag, 0)
	if err != nil {
		return nil, f.pathError(p, err)
	}
	return file, nil
}

func (f *fileSystem) stat(p string) (os.FileInfo, error) {
	if f.root == nil {
		if p == "" {
			return nil, newError(CodeBadRequest, "A path is required.")
		}
		fi, err := os.Stat(p)
		if err != nil {
			return nil, f.pathError(p, err)
		}
		return fi, nil
	}
	rel, err := f.rel(p)
	if err != nil {
		return nil, err
	}
	fi, err := f.root.Stat(rel)
	if err != nil {
		return nil, f.pathError(p, err)
	}
	return fi, nil
}

// readFile opens p for reading limit bytes at offset and reports its size.
func (f *fileSystem) readFile(p string, offset, limit int64) (io.ReadCloser, int64, int64, error) {
	// Open first (without blocking), then check what was opened: a type
	// checked before opening may be swapped for a FIFO in between.
	file, err := f.openRead(p)
	if err != nil {
		return nil, 0, 0, err
	}
	fi, err := file.Stat()
	if err != nil {
		file.Close()
		return nil, 0, 0, f.pathError(p, err)
	}
	if fi.IsDir() {
		file.Close()
		return nil, 0, 0, newError(CodeIsDirectory, "The path %q is a directory; use POST /v1/files/stat to inspect it.", p)
	}
	if !fi.Mode().IsRegular() {
		file.Close()
		return nil, 0, 0, newError(CodeBadRequest, "The path %q is not a regular file.", p)
	}
	if f.refuseLinked && linkCount(fi) > 1 {
		file.Close()
		return nil, 0, 0, newError(CodePathOutsideRoot, "The file %q has more than one hard link; such files are not served.", p)
	}
	size := fi.Size()
	n := max(min(limit, size-offset), 0)
	sr := io.NewSectionReader(file, offset, n)
	return struct {
		io.Reader
		io.Closer
	}{sr, file}, size, n, nil
}

// statAll examines each path, following symlinks (inside the root).
func (f *fileSystem) statAll(paths []string) []FileStat {
	out := make([]FileStat, len(paths))
	for i, p := range paths {
		out[i].Path = p
		fi, err := f.stat(p)
		if err != nil {
			var e *Error
			if errors.As(err, &e) && e.Code != CodeNotFound {
				out[i].Error = &ErrorBody{Code: e.Code, Message: e.Message}
			}
			continue
		}
		mtime := fi.ModTime().UTC()
		out[i].Exists = true
		out[i].Type = fileType(fi.Mode())
		out[i].Size = fi.Size()
		out[i].Mode = fmt.Sprintf("%04o", fi.Mode().Perm())
		out[i].MTime = &mtime
	}
	return out
}

func fileType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	default:
		return "other"
	}
}

func (f *fileSystem) close() {
	if f.root != nil {
		f.root.Close()
	}
}

// fetchSpec is one download: where it goes, how large it may be, and what
// to do with it.
type fetchSpec struct {
	url, path string
	maxBytes  int64
	unpack    string // "", ArchiveTarGz or ArchiveZip
	sha256    string // lower-case hex pin, or ""
	lim       writeLimits
}

// fetch downloads a URL into a temporary file beside the path, checks the
// pin, and then renames it over the path or unpacks it into the path as a
// directory: a broken, oversized or mismatched download leaves the path as
// it was.
func (f *fileSystem) fetch(ctx context.Context, client *http.Client, spec fetchSpec) (*FetchResponse, error) {
	u, err := url.Parse(spec.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, newError(CodeBadRequest, "The url must be an absolute http or https URL.")
	}
	if spec.unpack == "" {
		if fi, err := f.stat(spec.path); err == nil && fi.IsDir() {
			return nil, newError(CodeIsDirectory, "The path %q is a directory.", spec.path)
		}
	}
	pr, base, err := f.parentOf(spec.path)
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, newError(CodeBadRequest, "The url cannot be requested.")
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, newError(CodeTimeout, "The download did not finish in time.")
		}
		return nil, newError(CodeFetchFailed, "The download failed: %s.", redactURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, newError(CodeFetchFailed, "The download source answered %s.", resp.Status)
	}
	if resp.ContentLength > spec.maxBytes {
		return nil, newError(CodeTooLarge, "The download is %d bytes, over the limit of %d.", resp.ContentLength, spec.maxBytes)
	}
	tmp := stageName(base, "dl")
	file, err := pr.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, f.pathError(spec.path, err)
	}
	kept := false
	defer func() {
		file.Close()
		if !kept {
			pr.Remove(tmp)
		}
	}()
	n, sum, over, copyErr := hashingCopy(file, resp.Body, spec.maxBytes)
	switch {
	case over:
		return nil, newError(CodeTooLarge, "The download exceeds the limit of %d bytes.", spec.maxBytes)
	case copyErr != nil:
		if ctx.Err() != nil {
			return nil, newError(CodeTimeout, "The download did not finish in time.")
		}
		return nil, newError(CodeFetchFailed, "The download broke off after %d bytes.", n)
	case spec.sha256 != "" && sum != spec.sha256:
		return nil, newError(CodeChecksumMismatch, "The download's SHA-256 is %s, not the expected %s; nothing was written.", sum, spec.sha256)
	}
	out := &FetchResponse{Path: spec.path, Size: n, SHA256: sum}
	if spec.unpack != "" {
		if out.Files, err = unpackInto(pr, base, spec.path, file, n, spec.unpack, spec.lim); err != nil {
			return nil, err
		}
		return out, nil
	}
	if err := file.Chmod(defaultFileMode); err != nil {
		return nil, fmt.Errorf("agentd: chmod download: %w", err)
	}
	if err := file.Close(); err != nil {
		return nil, fmt.Errorf("agentd: close download: %w", err)
	}
	if err := pr.Rename(tmp, base); err != nil {
		return nil, f.pathError(spec.path, err)
	}
	kept = true
	return out, nil
}

// redactURLError keeps the failure reason but not the URL, which may carry
// credentials in its query.
func redactURLError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return strings.TrimSuffix(err.Error(), ".")
}

// fetchDeadline bounds a download's duration.
func fetchDeadline(requested int64, limit time.Duration) time.Duration {
	if requested <= 0 {
		return limit
	}
	return min(time.Duration(requested)*time.Millisecond, limit)
}
