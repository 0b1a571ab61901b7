-- The platform catalog: admins, the org registry, signing keys, platform sessions and the platform audit log.
CREATE TABLE platform_admins (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    email TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL DEFAULT '',
    password_hash TEXT NOT NULL,
    must_change_password BOOLEAN NOT NULL DEFAULT 0,
    created_at DATETIME NOT NULL,
    last_login_at DATETIME
);
CREATE TABLE organizations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    slug TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('active', 'suspended')),
    db_dialect TEXT NOT NULL,
    db_locator TEXT NOT NULL,
    db_attached BOOLEAN NOT NULL DEFAULT 0,
    created_at DATETIME NOT NULL,
    updated_at DATETIME NOT NULL,
    suspended_at DATETIME
);
CREATE TABLE signing_keys (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kid TEXT NOT NULL UNIQUE,
    sealed_key TEXT NOT NULL,
    created_at DATETIME NOT NULL
);
CREATE TABLE platform_sessions (
    id TEXT PRIMARY KEY,
    admin_id BIGINT NOT NULL REFERENCES platform_admins(id) ON DELETE CASCADE,
    created_at DATETIME NOT NULL,
    expires_at DATETIME NOT NULL,
    revoked_at DATETIME
);
CREATE TABLE platform_audit_events (
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
CREATE INDEX platform_audit_action ON platform_audit_events (action, seq);
CREATE INDEX platform_audit_occurred ON platform_audit_events (occurred_at, seq);
