package handlers

import (
	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/rbac"
)

func (s *Server) registerOrgSurface() {}

func (s *Server) authorizeOrg(c echo.Context, perm rbac.Perm, next echo.HandlerFunc) error {
	return apperr.New(apperr.ErrForbidden, "forbidden", "Not allowed.")
}
