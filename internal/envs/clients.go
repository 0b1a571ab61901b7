package envs

import (
	"net/http"
	"sync"
)

// AgentdClients builds the HTTP clients that reach environments' agentd.
// ClientFor makes a client per call; for a private environment it
// clones a netguard transport with keep-alives off (a transport made per
// call would otherwise leave its idle connections behind), so every
// keystroke, poll and recorded batch would open a new connection. Here the
// guarded client is made once and kept, with keep-alives on: its
// connections are reused, and every new one still passes netguard's check
// of where it landed before a byte is sent.
//
// ClientFor depends on an environment only through Private(), so one
// guarded client serves every private environment (its transport pools
// connections per address); were ClientFor to depend on more, the cache
// would have to be keyed by it.
type AgentdClients struct {
	// Private, when set, is the client for every private environment: one
	// whose own dialer refuses blocked addresses before connecting (see
	// netguard.Guarded), where the client For builds over a base with a
	// dialer of its own can only check where a connection landed, after
	// the handshake. The console sets it; tests mapping names leave it nil.
	Private *http.Client

	mu      sync.Mutex
	base    *http.Client
	guarded *http.Client
}

// For is base made fit for calls to e's agentd.
func (c *AgentdClients) For(base *http.Client, e Environment) *http.Client {
	if !e.Private() {
		// The base transport (and its connection pool) as it is.
		return ClientFor(base, e)
	}
	if c.Private != nil {
		return c.Private
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.guarded == nil || c.base != base {
		if c.guarded != nil {
			c.guarded.CloseIdleConnections()
		}
		hc := ClientFor(base, e)
		if tr, ok := hc.Transport.(*http.Transport); ok && (base == nil || tr != base.Transport) {
			// This client's own clone, kept for the process: its idle
			// connections are reused, not left behind.
			tr.DisableKeepAlives = false
		}
		c.base, c.guarded = base, hc
	}
	return c.guarded
}
