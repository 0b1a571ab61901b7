package agentd

import (
	"archive/tar"
	"archive/zip"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// maxLinkTarget bounds a symlink target read from a zip entry's body.
const maxLinkTarget = 4096

// entryName validates an archive entry's name and returns it as a local
// path, or "" for the archive's own top directory ("." or "./"). Names are
// refused when absolute, when any element is "..", or when they hold a NUL
// or a backslash (a Windows separator that would name a different file
// here than the archive's author meant).
func entryName(name string) (string, error) {
	switch {
	case name == "":
		return "", newError(CodeBadRequest, "An archive entry has an empty name.")
	case strings.IndexByte(name, 0) >= 0:
		return "", newError(CodeBadRequest, "An archive entry's name holds a NUL byte.")
	case strings.Contains(name, `\`):
		return "", newError(CodeBadRequest, "The archive entry %q holds a backslash.", name)
	case path.IsAbs(name):
		return "", newError(CodePathOutsideRoot, "The archive entry %q is an absolute path.", name)
	}
	for _, elem := range strings.Split(name, "/") {
		if elem == ".." {
			return "", newError(CodePathOutsideRoot, "The archive entry %q holds \"..\".", name)
		}
	}
	clean := path.Clean(name)
	if clean == "." {
		return "", nil
	}
	if !filepath.IsLocal(clean) {
		return "", newError(CodePathOutsideRoot, "The archive entry %q does not stay inside its directory.", name)
	}
	return filepath.FromSlash(clean), nil
}

// checkLinkTarget refuses a symlink at name whose target is absolute or
// leads out of the tree it belongs to.
func checkLinkTarget(name, target string) error {
	switch {
	case target == "":
		return newError(CodeBadRequest, "The symbolic link %q has no target.", name)
	case strings.IndexByte(target, 0) >= 0:
		return newError(CodeBadRequest, "The symbolic link %q has a target with a NUL byte.", name)
	case path.IsAbs(target) || filepath.IsAbs(target):
		return newError(CodePathOutsideRoot, "The symbolic link %q points to the absolute path %q.", name, target)
	}
	joined := path.Join(path.Dir(filepath.ToSlash(name)), target)
	if !filepath.IsLocal(joined) && joined != "." {
		return newError(CodePathOutsideRoot, "The symbolic link %q points outside its directory (%q).", name, target)
	}
	return nil
}

// topNotDir refuses an entry that names the archive's top directory but
// is not a directory.
func topNotDir(name string) error {
	return newError(CodeBadRequest, "The archive entry %q names the archive's top directory but is not a directory; such entries are refused.", name)
}

// tarSlack is what a tar stream of files entries may hold beyond their
// bodies of at most limit bytes: each entry's header block and padding,
// with room for a long name's PAX or GNU header, and the end-of-archive
// blocks; never more than 64 KiB over the limit itself, so the stream
// stays within about twice the limit however many entries are allowed.
func tarSlack(files int, limit int64) int64 {
	return 64<<10 + min(3<<10*int64(max(files, 0)), max(limit, 0))
}

// unpackReader reads the decompressed stream of an archive and fails with
// the over-limit error once it has given more than limit bytes, so the
// unpack limit bounds what is decompressed (headers the tar reader
// consumes itself, such as PAX records of up to 1 MiB each, included), not
// only the entry bodies that reach the tree writer.
type unpackReader struct {
	r     io.Reader
	n     int64 // bytes given so far
	limit int64 // the unpack limit plus slack for headers
	lim   int64 // the unpack limit the error names
}

func (c *unpackReader) Read(p []byte) (int, error) {
	if c.n >= c.limit {
		return 0, newError(CodeTooLarge, "The tree holds more than %d bytes.", c.lim)
	}
	if room := c.limit - c.n; int64(len(p)) > room {
		p = p[:room]
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// unpackTarGz unpacks a tar.gz into t; at most t's unpack limit plus
// tarSlack is decompressed, whatever the archive's headers say.
func unpackTarGz(t *treeWriter, file *os.File) error {
	if _, err := file.Seek(0, io.SeekStart); err != nil {
		return err
	}
	gz, err := gzip.NewReader(file)
	if err != nil {
		return newError(CodeBadRequest, "The archive is not gzip-compressed data.")
	}
	defer gz.Close()
	cr := &unpackReader{r: gz, limit: t.lim.unpackBytes + tarSlack(t.lim.unpackFiles, t.lim.unpackBytes), lim: t.lim.unpackBytes}
	defer func() { t.decompressed = cr.n }()
	tr := tar.NewReader(cr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		var e *Error
		if errors.As(err, &e) {
			return e
		}
		if err != nil {
			return newError(CodeBadRequest, "The archive is not a valid tar.gz: %s.", strings.TrimSuffix(err.Error(), "."))
		}
		name, err := entryName(h.Name)
		if err != nil {
			return err
		}
		if name == "" {
			// The top directory itself: nothing to create, but counted
			// toward the limit, so an archive of nothing else meets it.
			// Anything else by that name is refused before its body is
			// read (skipping it would decompress it uncounted).
			if h.Typeflag != tar.TypeDir {
				return topNotDir(h.Name)
			}
			if err := t.top(h.Name); err != nil {
				return err
			}
			continue
		}
		mode := fs.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			err = t.dir(name, mode)
		case tar.TypeReg: // the reader turns the legacy TypeRegA into TypeReg (or TypeDir)
			err = t.file(name, mode, tr)
		case tar.TypeSymlink:
			err = t.symlink(name, h.Linkname)
		case tar.TypeLink:
			var target string
			if target, err = entryName(h.Linkname); err == nil {
				if target == "" {
					err = newError(CodeBadRequest, "The hard link %q names the archive's top directory.", h.Name)
				} else {
					err = t.hardlink(name, target)
				}
			}
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			err = newError(CodeBadRequest, "The archive entry %q is a device or pipe; those are refused.", h.Name)
		default:
			err = newError(CodeBadRequest, "The archive entry %q has an unsupported type (%q).", h.Name, string(h.Typeflag))
		}
		if err != nil {
			return err
		}
	}
}

func unpackZip(t *treeWriter, file *os.File, size int64) error {
	zr, err := zip.NewReader(file, size)
	if err != nil {
		return newError(CodeBadRequest, "The archive is not a valid zip file.")
	}
	for _, zf := range zr.File {
		name, err := entryName(zf.Name)
		if err != nil {
			return err
		}
		if name == "" {
			if !zf.Mode().IsDir() && !strings.HasSuffix(zf.Name, "/") {
				return topNotDir(zf.Name)
			}
			if err := t.top(zf.Name); err != nil {
				return err
			}
			continue
		}
		mode := zf.Mode()
		switch {
		case mode.IsDir() || strings.HasSuffix(zf.Name, "/"):
			err = t.dir(name, mode)
		case mode&fs.ModeSymlink != 0:
			var target []byte
			if target, err = readZipEntry(zf, maxLinkTarget); err == nil {
				err = t.symlink(name, string(target))
			}
		case mode.IsRegular():
			var rc io.ReadCloser
			if rc, err = zf.Open(); err != nil {
				return newError(CodeBadRequest, "The archive entry %q cannot be read: %s.", zf.Name, err)
			}
			err = t.file(name, mode, rc)
			rc.Close()
		default:
			err = newError(CodeBadRequest, "The archive entry %q is a device, pipe or socket; those are refused.", zf.Name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func readZipEntry(zf *zip.File, limit int64) ([]byte, error) {
	rc, err := zf.Open()
	if err != nil {
		return nil, newError(CodeBadRequest, "The archive entry %q cannot be read: %s.", zf.Name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, newError(CodeBadRequest, "The archive entry %q cannot be read: %s.", zf.Name, err)
	}
	if int64(len(b)) > limit {
		return nil, newError(CodeBadRequest, "The symbolic link %q has a target longer than %d bytes.", zf.Name, limit)
	}
	return b, nil
}
