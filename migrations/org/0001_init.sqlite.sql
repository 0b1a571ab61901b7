-- Every organization's own database starts with its signing keys, settings and the hash-chained audit log.
CREATE TABLE org_settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE signing_keys (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kid TEXT NOT NULL UNIQUE,
    sealed_key TEXT NOT NULL,
    created_at DATETIME NOT NULL
);
CREATE TABLE audit_events (
    seq BIGINT PRIMARY KEY,
    occurred_at DATETIME NOT NULL,
    actor_type TEXT NOT NULL,
    actor_id TEXT NOT NULL,
    actor_name TEXT NOT NULL,
    source_ip TEXT NOT NULL,
    user_agent TEXT NOT NULL,
    action TEXT NOT NULL,
    target_type TEXT NOT NULL,
    target_id TEXT NOT NULL,
    target_name TEXT NOT NULL,
    decision TEXT NOT NULL,
    details TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX audit_action ON audit_events (action, seq);
CREATE INDEX audit_actor ON audit_events (actor_id, seq);
CREATE INDEX audit_actor_name ON audit_events (actor_name, seq);
CREATE INDEX audit_target ON audit_events (target_id, seq);
CREATE INDEX audit_target_name ON audit_events (target_name, seq);
CREATE INDEX audit_decision ON audit_events (decision, seq);
CREATE INDEX audit_occurred ON audit_events (occurred_at, seq);
