-- Approval requests: a command an agent's execution policy answered "ask"
-- waits here for a person. The row is bound to a digest of exactly what
-- will run (session, command text, env names and value hashes, working
-- directory, TTY, stdin); env values themselves are never stored, only
-- their names. state moves pending -> approved | denied | expired |
-- cancelled once, by a conditional UPDATE ... WHERE state = 'pending'.
CREATE TABLE approvals (
    id BIGSERIAL PRIMARY KEY,
    session_id BIGINT NOT NULL,
    agent_id BIGINT NOT NULL,
    department_id BIGINT,
    requester_type TEXT NOT NULL,
    requester_id TEXT NOT NULL,
    requester_name TEXT NOT NULL DEFAULT '',
    requester_via TEXT NOT NULL DEFAULT '',
    requester_user_id BIGINT,
    digest TEXT NOT NULL,
    command TEXT NOT NULL,
    program_key TEXT NOT NULL,
    cwd TEXT NOT NULL DEFAULT '',
    env_names TEXT NOT NULL DEFAULT '[]',
    tty BOOLEAN NOT NULL DEFAULT FALSE,
    stdin BOOLEAN NOT NULL DEFAULT FALSE,
    rule TEXT NOT NULL DEFAULT '',
    policy_digest TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    decider_type TEXT NOT NULL DEFAULT '',
    decider_id TEXT NOT NULL DEFAULT '',
    decider_name TEXT NOT NULL DEFAULT '',
    decision_reason TEXT NOT NULL DEFAULT '',
    scope TEXT NOT NULL DEFAULT '',
    granted_by BIGINT,
    command_id BIGINT,
    created_at TIMESTAMPTZ NOT NULL,
    decided_at TIMESTAMPTZ
);
CREATE INDEX approvals_state ON approvals (state, expires_at);
CREATE INDEX approvals_session ON approvals (session_id, id);
-- A "session" scope approval lets the same program and arguments run again
-- in that session without asking: one grant per (session, program key).
CREATE TABLE approval_grants (
    id BIGSERIAL PRIMARY KEY,
    session_id BIGINT NOT NULL,
    program_key TEXT NOT NULL,
    approval_id BIGINT NOT NULL REFERENCES approvals(id) ON DELETE CASCADE,
    created_at TIMESTAMPTZ NOT NULL,
    UNIQUE (session_id, program_key)
);
-- The org's approval webhook (at most one): posted when a request is
-- created, signed with HMAC-SHA256 under the secret, which is sealed.
CREATE TABLE approval_webhooks (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    url TEXT NOT NULL,
    secret_sealed TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
