-- Audit search matches actor: as a case-insensitive prefix of the actor's name
-- (audit.buildSQL: lower(actor_name) LIKE 'jane%'). text_pattern_ops lets a prefix
-- LIKE walk the index under any collation; seq keeps one name's events in order.
CREATE INDEX audit_actor_name_lower ON audit_events (lower(actor_name) text_pattern_ops, seq);
DROP INDEX IF EXISTS audit_actor_name;
