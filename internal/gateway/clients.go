package gateway

import (
	"net/http"

	"github.com/gatehouse/gatehouse/internal/envs"
)

// agentdHTTP is the client for calls to e's agentd, shared with the
// followers so both reuse one pool of connections.
func (g *Gateway) agentdHTTP(e envs.Environment) *http.Client {
	if g.Followers != nil {
		return g.Followers.HTTPFor(e)
	}
	return g.clients.For(g.HTTP, e)
}
