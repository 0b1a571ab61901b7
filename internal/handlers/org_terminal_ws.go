package handlers

import (
	"crypto/subtle"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/coder/websocket"
	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/terminal"
	"github.com/gatehouse/gatehouse/internal/views"
)

// terminalProtocol is the WebSocket subprotocol of the browser terminal; a
// browser also offers "csrf.<token>" to prove the page came from the
// console.
const terminalProtocol = "gatehouse.v1"

// wsTerminal bridges a browser terminal to the gateway. The handshake is
// refused unless it comes from the console's own origin and, when the
// sign-in cookie authenticates it, carries the CSRF token: a cross-site
// page cannot open it. API keys (an Authorization header, no cookie) need
// neither.
func (s *Server) wsTerminal(c echo.Context) error {
	sid, err := idParam(c, "id")
	if err != nil {
		return err
	}
	r := c.Request()
	p := principalOf(c)
	offered := websocketProtocols(r)
	if p.ViaCookie {
		// Refused handshakes are audited like every refusal: a page of
		// another site trying to open a terminal is worth knowing about.
		if !s.sameOrigin(r) {
			return s.refuseHandshake(c, sid, "the Origin "+strconv.Quote(r.Header.Get("Origin"))+" is not the console's",
				apperr.New(apperr.ErrForbidden, "cross_origin", "The terminal opens only from the console's own pages."))
		}
		token, _ := c.Get(ctxCSRF).(string)
		if !offersCSRF(offered, token) {
			return s.refuseHandshake(c, sid, "the handshake did not carry the page's CSRF token",
				apperr.New(apperr.ErrForbidden, "csrf_failed", "This page has expired or did not come from Gatehouse. Reload it and try again."))
		}
	}
	at := terminal.Attach{SessionID: sid, Watch: c.QueryParam("watch") == "1", Recheck: s.terminalRecheck(c)}
	if v := c.QueryParam("command"); v != "" {
		if at.CommandID, err = strconv.ParseInt(v, 10, 64); err != nil || at.CommandID < 1 {
			return &apperr.ValidationError{Fields: map[string]string{"command": "command must be a command id."}}
		}
	}
	cursor, err := uintQuery(c, "cursor")
	if err != nil {
		return err
	}
	at.Cursor = uint64(cursor)
	rows, _ := strconv.ParseUint(c.QueryParam("rows"), 10, 16)
	cols, _ := strconv.ParseUint(c.QueryParam("cols"), 10, 16)
	at.Rows, at.Cols = uint16(min(rows, 4096)), uint16(min(cols, 4096))
	conn, err := websocket.Accept(c.Response(), r, &websocket.AcceptOptions{Subprotocols: []string{terminalProtocol},
		// The origin was checked above for cookie-authenticated callers;
		// callers with their own credentials are not browsers.
		InsecureSkipVerify: true})
	if err != nil {
		return nil // Accept answered the client already
	}
	conn.SetReadLimit(64 << 10)
	// Bridge reports its own failures to the client; the request is over.
	_ = s.Terminal.Serve(r.Context(), conn, s.terminalOrg(c), actorOf(c), meta(c), at)
	return nil
}

// sameOrigin reports whether a browser's handshake comes from the console:
// the Origin is the configured base URL's, or the host the browser
// addressed (which a page of another site cannot make its own).
func (s *Server) sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" {
		return false
	}
	if s.BaseURL != "" {
		if b, err := url.Parse(s.BaseURL); err == nil && strings.EqualFold(b.Scheme, u.Scheme) && strings.EqualFold(b.Host, u.Host) {
			return true
		}
	}
	return strings.EqualFold(u.Host, r.Host)
}

func websocketProtocols(r *http.Request) []string {
	var out []string
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func offersCSRF(protocols []string, token string) bool {
	if len(token) < 20 {
		return false
	}
	for _, p := range protocols {
		if v, ok := strings.CutPrefix(p, "csrf."); ok && subtle.ConstantTimeCompare([]byte(v), []byte(token)) == 1 {
			return true
		}
	}
	return false
}

// terminalData is the terminal of a session page (a new shell), or of a
// command to watch.
func terminalData(c echo.Context, sessionID, commandID int64, watch bool) views.TerminalData {
	csrf, _ := c.Get(ctxCSRF).(string)
	return views.TerminalData{WSPath: "/o/" + tenantOf(c).Org.Slug + "/sessions/" + strconv.FormatInt(sessionID, 10) + "/terminal",
		CSRF: csrf, CommandID: commandID, Watch: watch}
}

// terminalCSP lets xterm.js style its screen: it writes a stylesheet of its
// own at run time. Scripts stay limited to the console's files.
func terminalCSP(c echo.Context) {
	c.Response().Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; form-action 'self'")
}

// pageWatch shows a running command's output live, read-only, or replays
// an ended one (of a closed session too, as the bridge does).
func (s *Server) pageWatch(c echo.Context) error {
	sid, cid, err := commandParams(c)
	if err != nil {
		return err
	}
	// The same read the bridge will make, so a refusal shows as a page.
	if err := s.Gateway.AuthorizeRead(c.Request().Context(), s.terminalOrg(c), actorOf(c), sid); err != nil {
		return err
	}
	terminalCSP(c)
	return render(c, http.StatusOK, views.WatchPage(s.orgPage(c, "Watch command "+strconv.FormatInt(cid, 10)), tenantOf(c).Org.Slug, sid,
		terminalData(c, sid, cid, true)))
}

// refuseHandshake records a refused terminal handshake (why says what was
// wrong) before answering it with err.
func (s *Server) refuseHandshake(c echo.Context, sessionID int64, why string, err error) error {
	target := audit.Target{Type: "session", ID: strconv.FormatInt(sessionID, 10), Name: "session #" + strconv.FormatInt(sessionID, 10)}
	if aerr := s.orgEvent(c, tenantOf(c), "terminal.refused", target, audit.Deny, map[string]any{"reason": why}); aerr != nil {
		return aerr
	}
	return err
}
