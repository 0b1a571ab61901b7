-- Agent sessions: one conversation of one agent for one user, with one
-- workspace and, in per-session sandbox mode, exactly one sandbox.
CREATE TABLE sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent_id BIGINT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    user_id BIGINT REFERENCES users(id) ON DELETE SET NULL,
    subject TEXT NOT NULL,
    created_by TEXT NOT NULL,
    environment_id BIGINT REFERENCES environments(id) ON DELETE SET NULL,
    template_id BIGINT REFERENCES templates(id) ON DELETE SET NULL,
    sandbox_mode TEXT NOT NULL CHECK (sandbox_mode IN ('off', 'per-session')),
    state TEXT NOT NULL CHECK (state IN ('pending', 'running', 'paused', 'closed', 'lost')),
    reason TEXT NOT NULL DEFAULT '',
    sandbox_id TEXT NOT NULL DEFAULT '',
    sandbox_domain TEXT NOT NULL DEFAULT '',
    workspace TEXT NOT NULL DEFAULT '',
    backend_state TEXT NOT NULL DEFAULT '',
    backend_seen_at DATETIME,
    version BIGINT NOT NULL DEFAULT 0,
    create_token TEXT NOT NULL DEFAULT '',
    create_started_at DATETIME,
    create_attempts INTEGER NOT NULL DEFAULT 0,
    agentd_failures INTEGER NOT NULL DEFAULT 0,
    created_at DATETIME NOT NULL,
    started_at DATETIME,
    last_used_at DATETIME,
    closed_at DATETIME,
    updated_at DATETIME NOT NULL
);
CREATE INDEX sessions_agent ON sessions (agent_id, id);
CREATE INDEX sessions_user ON sessions (user_id, id);
CREATE INDEX sessions_state ON sessions (state, id);
CREATE INDEX sessions_sandbox ON sessions (sandbox_id);
