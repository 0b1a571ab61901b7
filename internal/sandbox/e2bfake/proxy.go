package e2bfake

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/gatehouse/gatehouse/internal/sandbox"
)

// proxyError is the body the proxy answers with when it cannot forward.
type proxyError struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	SandboxID string `json:"sandboxId,omitempty"`
}

func writeProxyError(w http.ResponseWriter, status int, id, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(proxyError{Code: status, Message: msg, SandboxID: id})
}

// hostTarget recognises <port>-<sandboxID>.<domain>[:port].
func (s *Server) hostTarget(host string) (port int, id string, ok bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, found := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(s.cfg.Domain))
	if !found || strings.Contains(label, ".") {
		return 0, "", false
	}
	p, id, found := strings.Cut(label, "-")
	if !found || id == "" {
		return 0, "", false
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return 0, "", false
	}
	return port, id, true
}

// pathTarget recognises /sandbox/<sandboxID>/<port>[/rest].
func pathTarget(p string) (id string, port int, rest string, ok bool) {
	tail, found := strings.CutPrefix(p, "/sandbox/")
	if !found {
		return "", 0, "", false
	}
	parts := strings.SplitN(tail, "/", 3)
	if len(parts) < 2 || parts[0] == "" {
		return "", 0, "", false
	}
	port, err := strconv.Atoi(parts[1])
	if err != nil {
		return "", 0, "", false
	}
	rest = "/"
	if len(parts) == 3 {
		rest += parts[2]
	}
	return parts[0], port, rest, true
}

// proxy forwards a request to a port inside a sandbox, like CubeProxy or
// E2B's client proxy: only agentd's port is served (envd is not emulated);
// a paused sandbox refuses traffic unless it auto-resumes.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, id string, port int, path string) {
	s.mu.Lock()
	b, ok := s.sandboxes[id]
	if !ok {
		s.mu.Unlock()
		writeProxyError(w, http.StatusBadGateway, id, "The sandbox was not found.")
		return
	}
	if b.trafficToken != "" {
		tok := r.Header.Get("e2b-traffic-access-token")
		if tok == "" {
			tok = r.Header.Get("cube-traffic-access-token")
		}
		if tok != b.trafficToken {
			s.mu.Unlock()
			writeProxyError(w, http.StatusForbidden, id, "The sandbox requires a valid traffic access token.")
			return
		}
	}
	if b.state == sandbox.StatePaused {
		if !b.autoResume {
			s.mu.Unlock()
			writeProxyError(w, http.StatusBadGateway, id, "The sandbox is paused.")
			return
		}
		if err := s.thawLocked(b, b.timeout); err != nil {
			s.mu.Unlock()
			writeProxyError(w, http.StatusBadGateway, id, "The sandbox could not be resumed.")
			return
		}
	}
	addr := b.proc.Addr()
	s.mu.Unlock()

	if addr == "" {
		if port == sandbox.AgentdPort && r.Method == http.MethodPost && path == "/v1/token" {
			// Stands in for the rekey (see NopLauncher).
			w.WriteHeader(http.StatusNoContent)
			return
		}
		writeProxyError(w, http.StatusBadGateway, id, "Nothing listens in this sandbox (it has no process).")
		return
	}
	if port != sandbox.AgentdPort {
		writeProxyError(w, http.StatusBadGateway, id, "No service is listening on port "+strconv.Itoa(port)+".")
		return
	}
	target := &url.URL{Scheme: "http", Host: addr}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = path
			pr.Out.URL.RawPath = ""
			pr.Out.Header.Del("e2b-traffic-access-token")
			pr.Out.Header.Del("cube-traffic-access-token")
		},
		Transport: s.transport,
		// Flush at once: agentd long-polls and streams.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			s.cfg.Logger.Warn("proxy to sandbox", "sandbox_id", id, "err", err)
			writeProxyError(w, http.StatusBadGateway, id, "The sandbox did not answer.")
		},
	}
	rp.ServeHTTP(w, r)
}
