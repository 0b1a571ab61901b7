//go:build !unix

package agentd

import "io/fs"

// openNonblock is not needed where opening a named pipe does not wait.
const openNonblock = 0

// linkCount reports 1: hard links are not counted on this platform.
func linkCount(fs.FileInfo) uint64 { return 1 }
