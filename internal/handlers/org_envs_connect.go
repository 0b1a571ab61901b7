package handlers

import (
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/agentd/release"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/views"
)

// generatedTokenBytes gives 43 URL-safe characters, well over
// envs.MinTokenLength, and safe inside single quotes in every shell.
const generatedTokenBytes = 32

// generateAgentdToken fills in a host environment's agentd token when the
// form left it empty and returns it; a sandbox's token is baked into its
// template, so only its owner can say it.
func generateAgentdToken(req *envRequest) string {
	if req.Kind != envs.KindHost || req.AgentdToken != nil {
		return ""
	}
	tok := auth.RandomToken(generatedTokenBytes)
	req.AgentdToken = &tok
	return tok
}

// envCreatedWithToken answers the creation of a host whose token the
// console generated: the token goes, sealed, across the redirect to the
// host's page, which shows it and the commands that start agentd once (a
// reload shows neither, and creates nothing).
func (s *Server) envCreatedWithToken(c echo.Context, e envs.Environment, token string) error {
	path := envPagePath(c, e.ID)
	if err := s.stashReveal(c, path, token); err != nil {
		return err
	}
	s.setFlash(c, "Environment "+e.Name+" was added. Start agentd on the host with the command below; this page shows when it answers.")
	return c.Redirect(http.StatusSeeOther, path)
}

func envPagePath(c echo.Context, id int64) string {
	return "/o/" + tenantOf(c).Org.Slug + "/environments/" + itoa(id)
}

// hostConnect is the "Connect this host" section of a host environment's
// page, for those who manage it: on creation with a generated token, and
// afterwards until agentd has answered once.
func (s *Server) hostConnect(c echo.Context, e envs.Environment, row views.EnvRow) *views.HostConnect {
	if e.Kind != envs.KindHost || !row.CanManage {
		return nil
	}
	tok := s.takeReveal(c, envPagePath(c, e.ID))
	// Until agentd first answers (it reports its version), the commands
	// stay, with a placeholder once the token has been shown.
	if tok == "" && e.AgentdVersion != "" {
		return nil
	}
	hc := &views.HostConnect{Token: tok, URL: e.URL, PollURL: envPagePath(c, e.ID) + "/connection"}
	hc.Listen, hc.AllInterfaces, hc.TLS = hostListen(e.URL)
	hc.Root, hc.WindowsRoot = agentdRoot(e)
	hc.Downloads, hc.Missing = s.agentdDownloads(c)
	return hc
}

// agentdDownloads are the builds the connect page offers a command for,
// at the console's public address, and the labels of the usual platforms
// it has none for. A build that cannot be read is logged and left out:
// the page then says it has none rather than show a command that fails.
func (s *Server) agentdDownloads(c echo.Context) ([]views.AgentdDownload, []string) {
	builds, err := s.agentdBuilds()
	if err != nil {
		s.Logger.Error("agentd builds unavailable", "error", err)
	}
	have := map[string]bool{}
	var out []views.AgentdDownload
	for _, b := range builds {
		have[b.Platform] = true
		out = append(out, views.AgentdDownload{Platform: b.Platform, Label: release.Label(b.Platform),
			URL: s.absURL(c, "/downloads/agentd/"+b.Platform), SHA256: b.SHA256})
	}
	// Linux first, as the usual platforms run, then any others.
	rank := func(p string) int {
		if i := slices.Index(release.Standard, p); i >= 0 {
			return i
		}
		return len(release.Standard)
	}
	slices.SortStableFunc(out, func(a, b views.AgentdDownload) int { return rank(a.Platform) - rank(b.Platform) })
	var missing []string
	for _, p := range release.Standard {
		if !have[p] {
			missing = append(missing, release.Label(p))
		}
	}
	return out, missing
}

// defaultAgentdPort is agentd's port when a URL names none.
const defaultAgentdPort = "49984"

// hostListen is where agentd should listen for an environment registered
// at rawURL: the address the URL names (127.0.0.1 stays loopback; another
// IP is that interface), every interface for a host name (agentd cannot
// listen on a name), and loopback behind a TLS proxy for https, since
// agentd itself serves plain HTTP.
func hostListen(rawURL string) (listen string, allInterfaces, tls bool) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Hostname() == "" {
		return net.JoinHostPort("0.0.0.0", defaultAgentdPort), true, false
	}
	if u.Scheme == "https" {
		return net.JoinHostPort("127.0.0.1", defaultAgentdPort), false, true
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return net.JoinHostPort("127.0.0.1", port), false, false
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return net.JoinHostPort(ip.String(), port), false, false
	}
	return net.JoinHostPort("0.0.0.0", port), true, false
}

// agentdRoot is the directory the generated command gives agentd with
// --root: the environment's workspace root when it names one (workspaces
// live there), else a directory of agentd's own in the home directory.
func agentdRoot(e envs.Environment) (unix, windows string) {
	if e.WorkspaceRoot != "" {
		return shellQuote(e.WorkspaceRoot), e.WorkspaceRoot
	}
	return "$HOME/gatehouse-agentd", `$env:USERPROFILE\gatehouse-agentd`
}

// shellQuote quotes s for a POSIX shell unless it is plainly safe.
func shellQuote(s string) string {
	safe := true
	for _, r := range s {
		if !(r == '/' || r == '-' || r == '_' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			safe = false
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// envConnection is a connection check's outcome for the page's script.
type envConnection struct {
	Status  string `json:"status"`
	Message string `json:"message"`
	// Checked is the page's "Last checked" after this check.
	Checked string `json:"checked"`
}

// newEnvConnection is the outcome of a check made at, for the page's
// script: the badge, the message and "Last checked" all follow it.
func newEnvConnection(e envs.Environment, h envs.Health, at time.Time) envConnection {
	checked := views.When(at)
	if h.Error == "" {
		checked += " (" + strconv.FormatInt(h.Latency.Milliseconds(), 10) + " ms)"
	}
	return envConnection{Status: h.Status, Message: connectionMessage(e, h), Checked: checked}
}

// connectionMessage says what a check found, in the page's words.
func connectionMessage(e envs.Environment, h envs.Health) string {
	switch {
	case h.Status == envs.HealthHealthy:
		msg := "Connected: " + e.Name + " answered in " + strconv.FormatInt(h.Latency.Milliseconds(), 10) + " ms"
		if h.Version != "" {
			msg += " (agentd " + h.Version + ")"
		}
		return msg + "."
	case h.Error != "":
		return "Connection " + h.Status + ": " + h.Error
	}
	return "Connection " + h.Status + "."
}

// pageEnvConnection checks a host now (briefly) for the page that waits
// for it to answer. Like Test connection it records the health it finds
// (a change is audited), but it is not itself an audited test: the page
// asks every few seconds.
func (s *Server) pageEnvConnection(c echo.Context) error {
	id, err := idParam(c, "id")
	if err != nil {
		return err
	}
	e, h, err := s.envService(c).Test(c.Request().Context(), actorOf(c), id, tenantOf(c).Audit, 4*time.Second)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newEnvConnection(e, h, s.Now()))
}
