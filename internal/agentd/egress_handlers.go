package agentd

import (
	"context"
	"net/http"
	"net/url"
)

// NetworkPolicyAnswer is the answer to PUT /v1/sessions/{id}/network_policy:
// the version in force (the one sent, or a newer one already there).
type NetworkPolicyAnswer struct {
	SessionID     string `json:"session_id"`
	PolicyVersion int64  `json:"policy_version"`
}

// handleNetworkPolicy replaces a running session's network policy: every
// connection and name lookup that starts afterwards is decided by it (ones
// already open keep the version they were decided by). A version older
// than the one in force changes nothing, so updates that cross on their
// way keep the newest.
func (s *Server) handleNetworkPolicy(w http.ResponseWriter, r *http.Request) error {
	sess, err := s.session(r.PathValue("id"))
	if err != nil {
		return err
	}
	var np NetworkPolicy
	if err := decodeJSON(w, r, &np, maxJSONBody); err != nil {
		return err
	}
	if err := np.check(); err != nil {
		return err
	}
	if sess.egress == nil {
		return newError(CodeNoNetworkPolicy, "The session was created without a network policy; its connections are not confined, so a policy cannot be set now.")
	}
	sess.mu.Lock()
	running := sess.state == StateRunning
	sess.mu.Unlock()
	if !running {
		return newError(CodeNotRunning, "The session has already ended.")
	}
	v := sess.egress.replacePolicy(&np)
	writeJSON(w, http.StatusOK, NetworkPolicyAnswer{SessionID: sess.id, PolicyVersion: v})
	return nil
}

// SetNetworkPolicy replaces a running session's network policy and
// returns the version in force (see handleNetworkPolicy).
func (c *Client) SetNetworkPolicy(ctx context.Context, id string, np *NetworkPolicy) (int64, error) {
	var ans NetworkPolicyAnswer
	if err := c.do(ctx, http.MethodPut, "/v1/sessions/"+url.PathEscape(id)+"/network_policy", np, &ans, MaxControlAnswer); err != nil {
		return 0, err
	}
	return ans.PolicyVersion, nil
}
