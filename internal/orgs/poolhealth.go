package orgs

import (
	"context"
	"database/sql"
	"sort"

	"gorm.io/gorm"
)

// held is a reference on an open pool, taken so it is not closed while a
// caller reads or pings it.
type held struct {
	slug string
	p    *pool
}

func (s *Service) holdAll() []held {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]held, 0, len(s.pools))
	for slug, p := range s.pools {
		p.refs++
		out = append(out, held{slug, p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].slug < out[j].slug })
	return out
}

// releaseAll drops the references without marking the pools used: a
// scrape or a readiness probe must not keep idle pools open.
func (s *Service) releaseAll(hs []held) {
	var closeNow []*pool
	s.mu.Lock()
	for _, h := range hs {
		if s.unrefLocked(h.p) {
			closeNow = append(closeNow, h.p)
		}
	}
	s.mu.Unlock()
	for _, p := range closeNow {
		p.shut()
	}
}

// PoolStats reports the connection stats of every open org pool, by slug
// (for metrics). Pools are not opened for it.
func (s *Service) PoolStats() map[string]sql.DBStats {
	hs := s.holdAll()
	defer s.releaseAll(hs)
	out := make(map[string]sql.DBStats, len(hs))
	for _, h := range hs {
		if sqlDB, err := h.p.db.DB(); err == nil {
			out[h.slug] = sqlDB.Stats()
		}
	}
	return out
}

// PingPools pings every open org pool (for readiness), by slug; a nil error
// is a healthy pool. Pools are not opened for it.
func (s *Service) PingPools(ctx context.Context) map[string]error {
	hs := s.holdAll()
	defer s.releaseAll(hs)
	out := make(map[string]error, len(hs))
	for _, h := range hs {
		sqlDB, err := h.p.db.DB()
		if err == nil {
			err = sqlDB.PingContext(ctx)
		}
		out[h.slug] = err
	}
	return out
}

// EachOpen runs fn on every open org pool, by slug order, stopping at the
// first error. Pools are not opened for it nor marked used: a metrics
// scrape must not keep idle pools open.
func (s *Service) EachOpen(fn func(slug string, db *gorm.DB) error) error {
	hs := s.holdAll()
	defer s.releaseAll(hs)
	for _, h := range hs {
		if err := fn(h.slug, h.p.db); err != nil {
			return err
		}
	}
	return nil
}
