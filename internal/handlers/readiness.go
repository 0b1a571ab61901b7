package handlers

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/store"
)

// readinessTimeout bounds the probes of one /readyz answer.
const readinessTimeout = 2 * time.Second

// readiness is /readyz's body: what was checked and, in problems, what is
// wrong in words. Errors are named, never quoted: a driver error can carry
// a host or a user name.
type readiness struct {
	// Status is ok, degraded (an org database is down: that org alone is
	// affected, so the replica stays in rotation) or unavailable (the
	// catalog is unreachable or its schema is behind this binary).
	Status     string            `json:"status"`
	Catalog    string            `json:"catalog"`
	Migrations map[string]string `json:"migrations"`
	// Orgs is the health of each org pool this process has open.
	Orgs     map[string]string `json:"orgs"`
	Problems []string          `json:"problems"`
}

func (s *Server) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), readinessTimeout)
	defer cancel()
	r := readiness{Status: "ok", Catalog: "reachable", Migrations: map[string]string{}, Orgs: map[string]string{}, Problems: []string{}}
	if err := ping(ctx, s.Catalog); err != nil {
		s.Logger.Warn("readiness: catalog unreachable", "error", err)
		r.Status, r.Catalog = "unavailable", "unreachable"
		r.Problems = append(r.Problems, "The catalog database is unreachable.")
	} else if pending, err := store.Pending(ctx, s.Catalog, store.CatalogSet); err != nil {
		s.Logger.Warn("readiness: catalog migrations unreadable", "error", err)
		r.Status, r.Migrations["catalog"] = "unavailable", "unreadable"
		r.Problems = append(r.Problems, "The catalog's schema_migrations table cannot be read.")
	} else if len(pending) > 0 {
		r.Status, r.Migrations["catalog"] = "unavailable", "pending"
		versions := make([]int, len(pending))
		for i, m := range pending {
			versions[i] = m.Version
		}
		r.Problems = append(r.Problems, fmt.Sprintf("Catalog migrations not applied: %v (run console migrate).", versions))
	} else {
		r.Migrations["catalog"] = "current"
	}
	if s.Orgs != nil {
		pings := s.Orgs.PingPools(ctx)
		slugs := make([]string, 0, len(pings))
		for slug := range pings {
			slugs = append(slugs, slug)
		}
		sort.Strings(slugs)
		for _, slug := range slugs {
			if err := pings[slug]; err != nil {
				s.Logger.Warn("readiness: org database unreachable", "org", slug, "error", err)
				r.Orgs[slug] = "unreachable"
				r.Problems = append(r.Problems, fmt.Sprintf("The database of org %s is unreachable; only that org is affected.", slug))
				if r.Status == "ok" {
					r.Status = "degraded"
				}
				continue
			}
			r.Orgs[slug] = "reachable"
		}
	}
	status := http.StatusOK
	if r.Status == "unavailable" {
		status = http.StatusServiceUnavailable
	}
	return c.JSON(status, r)
}
