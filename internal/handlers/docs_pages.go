package handlers

import (
	"io/fs"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/docs"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/views"
)

// pageDoc serves an embedded document (docs/<name>.md) as a page, so the
// console explains its concepts from its own origin.
func (s *Server) pageDoc(c echo.Context) error {
	name := c.Param("name")
	if name == "" || strings.ContainsAny(name, "/.\\") {
		return apperr.New(apperr.ErrNotFound, "not_found", "There is no such document.")
	}
	b, err := fs.ReadFile(docs.FS, name+".md")
	if err != nil {
		return apperr.New(apperr.ErrNotFound, "not_found", "There is no such document.")
	}
	title, _, _ := strings.Cut(string(b), "\n")
	return render(c, http.StatusOK, views.DocPage(s.page(c, strings.TrimSpace(strings.TrimLeft(title, "# "))), views.Markdown(string(b))))
}
