// Command agentd is the terminal daemon every execution environment runs.
// It serves the protocol described in docs/agentd-protocol.md; its command
// line is internal/agentd/cli, which the console's binary also runs when
// started under the name agentd.
package main

import "github.com/gatehouse/gatehouse/internal/agentd/cli"

func main() { cli.Main() }
