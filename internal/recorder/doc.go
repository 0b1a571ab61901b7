// Package recorder records the output of running commands: each command
// started through the gateway is followed by one replica at a time, under
// a lease in its row, from its start to its end whether or not anyone
// polls it, and a replica that dies leaves its commands to another, which
// continues from the last stored chunk with no gap and no duplicate.
//
// Each output byte is read from agentd once, by the command's follower.
// Clients' long-polls of a command followed on their replica are answered
// from what the follower just read, kept in a window bounded per command
// and over the process (Followers.LiveBudget); a client behind the window
// reads the recording, and one whose command another replica follows (or
// whose follower waits out a failure) polls agentd.
package recorder
