//go:build !linux

package cli

// subreaperSupported: only Linux has child subreapers.
const subreaperSupported = false

// hardenProcess has nothing to do here: there is no /proc to read another
// process's memory or environment through.
func hardenProcess() error { return nil }

// protectedHardlinks is false: the Linux protection cannot be assumed.
func protectedHardlinks() bool { return false }
