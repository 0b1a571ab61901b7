package handlers

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// apiOpenAPI serves the API's OpenAPI document (internal/apidoc) as JSON.
func (s *Server) apiOpenAPI(c echo.Context) error {
	b, err := s.apiDoc.JSON(c.Request().Context())
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "public, max-age=300")
	return c.JSONBlob(http.StatusOK, b)
}
