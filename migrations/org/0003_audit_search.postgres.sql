-- Free-text audit search: a trigram index over the text the review search box matches
-- (audit.searchExpr; the expression must stay identical for the planner to use it).
-- pg_trgm is a trusted extension (Postgres 13+), so a database owner may create it.
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE INDEX audit_search_trgm ON audit_events USING gin ((action || ' ' || actor_name || ' ' || target_name || ' ' || details) gin_trgm_ops);
