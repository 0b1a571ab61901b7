package handlers

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

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
	} else if pending, err := pendingMigrations(ctx, s.Catalog, store.CatalogSet); err != nil {
		s.Logger.Warn("readiness: catalog migrations unreadable", "error", err)
		r.Status, r.Migrations["catalog"] = "unavailable", "unreadable"
		r.Problems = append(r.Problems, "The catalog's schema_migrations table cannot be read.")
	} else if len(pending) > 0 {
		r.Status, r.Migrations["catalog"] = "unavailable", "pending"
		r.Problems = append(r.Problems, fmt.Sprintf("Catalog migrations not applied: %v (run console migrate).", pending))
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

// pendingMigrations lists the steps of set this binary knows that db has
// not applied.
func pendingMigrations(ctx context.Context, db *gorm.DB, set store.Set) ([]int, error) {
	steps, err := store.Migrations(set, store.DialectOfDB(db))
	if err != nil {
		return nil, err
	}
	var applied []int
	if err := db.WithContext(ctx).Raw("SELECT version FROM schema_migrations").Scan(&applied).Error; err != nil {
		return nil, err
	}
	done := make(map[int]bool, len(applied))
	for _, v := range applied {
		done[v] = true
	}
	var pending []int
	for _, m := range steps {
		if !done[m.Version] {
			pending = append(pending, m.Version)
		}
	}
	return pending, nil
}
