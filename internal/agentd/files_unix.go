//go:build unix

package agentd

import (
	"io/fs"
	"syscall"
)

// openNonblock keeps open(2) from waiting for a FIFO's writer. It has no
// effect on reads of regular files.
const openNonblock = syscall.O_NONBLOCK

// linkCount is the number of hard links of fi's file.
func linkCount(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 1
}
