package handlers

import (
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

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
	hc := &views.HostConnect{Token: tok, URL: e.URL, Listen: "0.0.0.0:49984",
		PollURL: envPagePath(c, e.ID) + "/connection"}
	if u, err := url.Parse(e.URL); err == nil {
		hc.TLS = u.Scheme == "https"
		port := u.Port()
		if port == "" {
			port = map[bool]string{true: "443", false: "80"}[hc.TLS]
		}
		hc.Listen = net.JoinHostPort("0.0.0.0", port)
	}
	return hc
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
