//go:build !unix

package cli

// reexecClean does nothing where a process cannot replace its own image:
// agentd then only removes AGENTD_TOKEN from the environment its commands
// get (docs/agentd-protocol.md says so).
func reexecClean([]string, string) error { return nil }
