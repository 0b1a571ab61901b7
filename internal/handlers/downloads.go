package handlers

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/agentd/release"
	"github.com/gatehouse/gatehouse/internal/apperr"
)

// agentdBuilds lists what /downloads/agentd/ offers; none without a
// catalog.
func (s *Server) agentdBuilds() ([]release.Build, error) {
	if s.Agentd == nil {
		return nil, nil
	}
	return s.Agentd.Builds()
}

// downloadAgentdSums is SHA256SUMS: a line per build, as sha256sum -c
// reads it.
func (s *Server) downloadAgentdSums(c echo.Context) error {
	builds, err := s.agentdBuilds()
	if err != nil {
		return err
	}
	sums := release.Sums(builds)
	c.Response().Header().Set(echo.HeaderContentLength, strconv.Itoa(len(sums)))
	c.Response().Header().Set("Cache-Control", "no-cache")
	return c.Blob(http.StatusOK, echo.MIMETextPlainCharsetUTF8, []byte(sums))
}

// downloadAgentd serves one platform's agentd to anyone: hosts fetch it
// before they hold any credential, as from Coder's /bin/.
func (s *Server) downloadAgentd(c echo.Context) error {
	builds, err := s.agentdBuilds()
	if err != nil {
		return err
	}
	name := c.Param("platform")
	available := make([]string, len(builds))
	for i, b := range builds {
		if b.Platform == name {
			return serveBuild(c, b)
		}
		available[i] = b.Platform
	}
	msg := fmt.Sprintf("This console has no agentd build for %q.", name)
	if len(available) == 0 {
		msg += " It has none: its operator builds them with scripts/release-agentd and points --agentd-dir at them."
	} else {
		msg += " It has " + strings.Join(available, ", ") + "."
	}
	return apperr.New(apperr.ErrNotFound, "no_agentd_build", "%s", msg)
}

// serveBuild streams b's file with the size and hash that were computed
// for it. A HEAD answers the same headers without the body.
func serveBuild(c echo.Context, b release.Build) error {
	f, err := os.Open(b.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, "application/octet-stream")
	h.Set(echo.HeaderContentLength, strconv.FormatInt(b.Size, 10))
	h.Set(echo.HeaderContentDisposition, `attachment; filename="`+b.FileName()+`"`)
	h.Set("Cache-Control", "no-cache")
	c.Response().WriteHeader(http.StatusOK)
	if c.Request().Method == http.MethodHead {
		return nil
	}
	// A download cut short is the caller's: the checksum step catches it.
	_, _ = io.CopyN(c.Response(), f, b.Size)
	return nil
}
