//go:build !unix

package storetest

import "testing"

// Crowded takes no turn where there is no flock: such tests are not run
// there beside others.
func Crowded(t testing.TB) { t.Helper() }
