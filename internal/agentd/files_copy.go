package agentd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// copyIn copies the file or directory tree at from (an absolute path
// anywhere agentd can read) to to (confined like every write). A file is
// written beside to and renamed into place; a tree is built in a staging
// directory beside to and swapped in, replacing a directory there.
//
// Reading from outside the root is allowed because it reveals nothing a
// command could not read itself: when commands run as agentd's own user
// they can cat the same files, and when they run as another user (RunAs)
// every source file must be readable by others and every directory on
// the way searchable by others (othersMayRead), so the copy cannot carry
// a file only agentd's user may read into the workspace. The directories
// are checked as they are opened, one by one, so a symlink swapped in
// after from was resolved is refused rather than followed. /proc is
// refused: agentd's own process files there are hidden from commands.
func (f *fileSystem) copyIn(from, to string, lim writeLimits) (*CopyResponse, error) {
	switch {
	case from == "" || to == "":
		return nil, newError(CodeBadRequest, "Both from and to are required.")
	case strings.IndexByte(from, 0) >= 0:
		return nil, newError(CodeBadRequest, "The from path contains a NUL byte.")
	case !filepath.IsAbs(from):
		return nil, newError(CodeBadRequest, "The from path %q must be absolute.", from)
	}
	src, err := filepath.EvalSymlinks(filepath.Clean(from))
	if err != nil {
		return nil, sourceError(from, err)
	}
	if src == "/proc" || strings.HasPrefix(src, "/proc/") {
		// agentd makes itself non-dumpable so that commands cannot read
		// its /proc/PID files; read by agentd itself, they would be.
		return nil, newError(CodePathOutsideRoot, "The source %q lies under /proc, which agentd does not copy from.", from)
	}
	if f.afterResolve != nil {
		f.afterResolve()
	}
	sp, sbase, err := openSourceParent(from, src, f.sourcesForOthers)
	if err != nil {
		return nil, err
	}
	defer sp.Close()
	fi, err := sp.Lstat(sbase)
	if err != nil {
		return nil, sourceError(from, err)
	}
	pr, base, err := f.parentOf(to)
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	if fi.Mode().IsRegular() {
		return f.copyFile(pr, base, from, sp, sbase, fi, to, lim)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		// It was resolved: it became a link since.
		return nil, errSourceChanged(from)
	}
	if !fi.IsDir() {
		return nil, newError(CodeBadRequest, "The source %q is neither a regular file nor a directory.", from)
	}
	if f.rootDir != "" {
		if rel, err := f.rel(to); err == nil && within(src, filepath.Join(f.rootDir, rel)) {
			return nil, newError(CodeBadRequest, "The destination %q lies inside the source %q.", to, from)
		}
	}
	return f.copyTree(pr, base, from, sp, sbase, to, lim)
}

// errSourceChanged refuses a source that changed while it was opened.
func errSourceChanged(from string) error {
	return newError(CodeBadRequest, "The source %q changed while it was being read (it was replaced, or it or a directory on its way became a symbolic link).", from)
}

// openSourceParent opens the directory holding src (absolute, symlinks
// resolved) one element at a time from "/", and returns it with src's
// last element. Each element must still be the directory it was when
// looked at (not a symlink swapped in since src was resolved), so the
// directories checked (forOthers: each must let others in) are the
// directories the copy reads through.
func openSourceParent(from, src string, forOthers bool) (*os.Root, string, error) {
	r, err := os.OpenRoot(string(filepath.Separator))
	if err != nil {
		return nil, "", sourceError(from, err)
	}
	check := func(fi fs.FileInfo) error {
		if forOthers && fi.Mode().Perm()&0o001 == 0 {
			return newError(CodePathOutsideRoot, "The source %q lies in a directory others may not enter; commands here could not read it.", from)
		}
		return nil
	}
	if fi, err := r.Stat("."); err != nil {
		r.Close()
		return nil, "", sourceError(from, err)
	} else if err := check(fi); err != nil {
		r.Close()
		return nil, "", err
	}
	for _, elem := range strings.Split(filepath.Dir(src), string(filepath.Separator)) {
		if elem == "" {
			continue
		}
		next, err := openSameDir(r, elem, from)
		r.Close()
		if err != nil {
			return nil, "", err
		}
		fi, err := next.Stat(".")
		if err == nil {
			err = check(fi)
		}
		if err != nil {
			next.Close()
			return nil, "", err
		}
		r = next
	}
	return r, filepath.Base(src), nil
}

// openSameDir opens the directory name inside r, refusing it when it is
// a symlink or was replaced between looking at it and opening it.
func openSameDir(r *os.Root, name, from string) (*os.Root, error) {
	fi, err := r.Lstat(name)
	if err != nil {
		return nil, sourceError(from, err)
	}
	if !fi.IsDir() {
		return nil, errSourceChanged(from)
	}
	next, err := r.OpenRoot(name)
	if err != nil {
		return nil, sourceError(from, err)
	}
	got, err := next.Stat(".")
	if err != nil || !os.SameFile(fi, got) {
		next.Close()
		return nil, errSourceChanged(from)
	}
	return next, nil
}

func sourceError(from string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return newError(CodeNotFound, "The source %q does not exist.", from)
	case errors.Is(err, fs.ErrPermission):
		return newError(CodePathOutsideRoot, "The source %q is not readable.", from)
	default:
		return newError(CodeBadRequest, "The source %q cannot be used.", from)
	}
}

// othersMayRead refuses an entry others may not read (directories: read
// and search).
func othersMayRead(name string, fi fs.FileInfo) error {
	want := fs.FileMode(0o004)
	if fi.IsDir() {
		want = 0o005
	}
	if fi.Mode().Perm()&want != want {
		return newError(CodePathOutsideRoot, "The source entry %q is not readable by others; commands here could not read it.", name)
	}
	return nil
}

func (f *fileSystem) copyFile(pr *os.Root, base, from string, sp *os.Root, sbase string, seen fs.FileInfo, to string, lim writeLimits) (*CopyResponse, error) {
	if fi, err := pr.Stat(base); err == nil && fi.IsDir() {
		return nil, newError(CodeIsDirectory, "The destination %q is a directory.", to)
	}
	in, err := sp.OpenFile(sbase, os.O_RDONLY|openNonblock, 0)
	if err != nil {
		return nil, sourceError(from, err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, newError(CodeBadRequest, "The source %q is not a regular file.", from)
	}
	if !os.SameFile(seen, fi) {
		return nil, errSourceChanged(from)
	}
	if f.sourcesForOthers {
		if err := othersMayRead(from, fi); err != nil {
			return nil, err
		}
	}
	tmp := stageName(base, "cp")
	out, err := pr.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, f.pathError(to, err)
	}
	n, sum, over, copyErr := hashingCopy(out, in, lim.unpackBytes)
	if copyErr == nil && !over {
		copyErr = out.Chmod(fi.Mode().Perm())
	}
	closeErr := out.Close()
	switch {
	case over:
		pr.Remove(tmp)
		return nil, newError(CodeTooLarge, "The source %q holds more than %d bytes.", from, lim.unpackBytes)
	case copyErr != nil:
		pr.Remove(tmp)
		return nil, fmt.Errorf("agentd: copy %s: %w", from, copyErr)
	case closeErr != nil:
		pr.Remove(tmp)
		return nil, fmt.Errorf("agentd: copy %s: %w", from, closeErr)
	}
	if err := pr.Rename(tmp, base); err != nil {
		pr.Remove(tmp)
		return nil, f.pathError(to, err)
	}
	return &CopyResponse{Path: to, Size: n, SHA256: sum, Files: 1}, nil
}

// copyTree walks src through a root of its own, so an entry (or a symlink
// swapped in during the walk) cannot lead the copy outside the tree.
func (f *fileSystem) copyTree(pr *os.Root, base, from string, sp *os.Root, sbase, to string, lim writeLimits) (*CopyResponse, error) {
	if fi, err := pr.Lstat(base); err == nil && !fi.IsDir() {
		return nil, newError(CodeBadRequest, "The destination %q exists and is not a directory.", to)
	}
	sr, err := openSameDir(sp, sbase, from)
	if err != nil {
		return nil, err
	}
	defer sr.Close()
	if f.sourcesForOthers {
		fi, err := sr.Stat(".")
		if err != nil {
			return nil, sourceError(from, err)
		}
		if err := othersMayRead(from, fi); err != nil {
			return nil, err
		}
	}
	stage := stageName(base, "dir")
	if err := pr.Mkdir(stage, defaultDirMode); err != nil {
		return nil, fmt.Errorf("agentd: stage %s: %w", stage, err)
	}
	dst, err := pr.OpenRoot(stage)
	if err != nil {
		pr.RemoveAll(stage)
		return nil, fmt.Errorf("agentd: stage %s: %w", stage, err)
	}
	t := newTreeWriter(dst, lim)
	t.hashing = true
	err = fs.WalkDir(sr.FS(), ".", func(name string, d fs.DirEntry, walkErr error) error {
		if walkErr != nil {
			return sourceError(filepath.Join(from, name), walkErr)
		}
		if name == "." {
			if info, err := d.Info(); err == nil {
				t.dirModes["."] = info.Mode().Perm()
			}
			return nil
		}
		return f.copyEntry(t, sr, from, name, d)
	})
	if err == nil {
		err = t.finish()
	}
	dst.Close()
	if err != nil {
		pr.RemoveAll(stage)
		return nil, err
	}
	if err := swapDir(pr, stage, base, to); err != nil {
		pr.RemoveAll(stage)
		return nil, err
	}
	return &CopyResponse{Path: to, Size: t.bytes, SHA256: treeHash(t.entries), Files: t.files}, nil
}

func (f *fileSystem) copyEntry(t *treeWriter, sr *os.Root, from, name string, d fs.DirEntry) error {
	local := filepath.FromSlash(name)
	full := filepath.Join(from, local)
	info, err := d.Info()
	if err != nil {
		return sourceError(full, err)
	}
	if f.sourcesForOthers && info.Mode()&fs.ModeSymlink == 0 {
		if err := othersMayRead(full, info); err != nil {
			return err
		}
	}
	switch {
	case info.IsDir():
		return t.dir(local, info.Mode())
	case info.Mode()&fs.ModeSymlink != 0:
		target, err := sr.Readlink(local)
		if err != nil {
			return sourceError(full, err)
		}
		return t.symlink(local, target)
	case info.Mode().IsRegular():
		if f.beforeEntryOpen != nil {
			f.beforeEntryOpen(local)
		}
		in, err := sr.OpenFile(local, os.O_RDONLY|openNonblock, 0)
		if err != nil {
			return sourceError(full, err)
		}
		defer in.Close()
		// Check what was opened, as copyFile does: the entry may have
		// been swapped for another (one others may not read) since the
		// listing.
		fi, err := in.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			return newError(CodeBadRequest, "The source entry %q is not a regular file.", full)
		}
		if !os.SameFile(info, fi) {
			return errSourceChanged(full)
		}
		if f.sourcesForOthers {
			if err := othersMayRead(full, fi); err != nil {
				return err
			}
		}
		return t.file(local, fi.Mode(), in)
	default:
		return newError(CodeBadRequest, "The source entry %q is a device, pipe or socket; those are refused.", full)
	}
}
