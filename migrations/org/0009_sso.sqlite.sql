-- Single sign-on (OpenID Connect): the org's one provider, the sign-ins
-- under way (state, nonce and PKCE verifier, each usable once), the
-- provider identities linked to users, and the roles the group mapping
-- granted (so a later sign-in removes only what the mapping gave).
CREATE TABLE sso_config (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    provider_name TEXT NOT NULL DEFAULT '',
    issuer_url TEXT NOT NULL,
    client_id TEXT NOT NULL,
    client_secret_sealed TEXT NOT NULL DEFAULT '',
    scopes TEXT NOT NULL DEFAULT 'openid email profile',
    email_claim TEXT NOT NULL DEFAULT 'email',
    groups_claim TEXT NOT NULL DEFAULT 'groups',
    allowed_domains TEXT NOT NULL DEFAULT '',
    mappings TEXT NOT NULL DEFAULT '[]',
    enabled BOOLEAN NOT NULL DEFAULT 0,
    password_login_disabled BOOLEAN NOT NULL DEFAULT 0,
    last_success_at DATETIME,
    updated_at DATETIME NOT NULL
);
CREATE TABLE sso_states (
    state_hash TEXT PRIMARY KEY,
    nonce TEXT NOT NULL,
    code_verifier TEXT NOT NULL,
    issuer_url TEXT NOT NULL,
    next_path TEXT NOT NULL DEFAULT '',
    created_at DATETIME NOT NULL,
    expires_at DATETIME NOT NULL
);
CREATE INDEX sso_states_expires ON sso_states (expires_at);
CREATE TABLE sso_identities (
    issuer TEXT NOT NULL,
    subject TEXT NOT NULL,
    user_id BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    email TEXT NOT NULL,
    created_at DATETIME NOT NULL,
    last_login_at DATETIME NOT NULL,
    PRIMARY KEY (issuer, subject)
);
CREATE INDEX sso_identities_user ON sso_identities (user_id);
CREATE TABLE sso_grants (
    user_id BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    domain TEXT NOT NULL,
    PRIMARY KEY (user_id, role, domain)
);
