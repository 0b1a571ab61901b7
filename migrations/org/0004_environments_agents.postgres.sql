-- Execution environments (agentd hosts and sandbox backends), sandbox templates and agents.
CREATE TABLE environments (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('host', 'sandbox')),
    department_id BIGINT REFERENCES departments(id) ON DELETE RESTRICT,
    owner_user_id BIGINT REFERENCES users(id) ON DELETE CASCADE,
    url TEXT NOT NULL DEFAULT '',
    os TEXT NOT NULL DEFAULT '',
    deployment TEXT NOT NULL DEFAULT '',
    workspace_root TEXT NOT NULL DEFAULT '',
    sandbox_domain TEXT NOT NULL DEFAULT '',
    sandbox_scheme TEXT NOT NULL DEFAULT '',
    proxy_base_url TEXT NOT NULL DEFAULT '',
    sealed_api_key TEXT NOT NULL DEFAULT '',
    sealed_agentd_token TEXT NOT NULL DEFAULT '',
    health_status TEXT NOT NULL DEFAULT 'unknown',
    health_error TEXT NOT NULL DEFAULT '',
    health_checked_at TIMESTAMPTZ,
    health_changed_at TIMESTAMPTZ,
    health_latency_ms INTEGER NOT NULL DEFAULT 0,
    agentd_version TEXT NOT NULL DEFAULT '',
    active_sessions INTEGER NOT NULL DEFAULT 0,
    created_by TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE UNIQUE INDEX environments_name ON environments (name);
CREATE INDEX environments_department ON environments (department_id);
CREATE INDEX environments_owner ON environments (owner_user_id);
CREATE TABLE templates (
    id BIGSERIAL PRIMARY KEY,
    environment_id BIGINT NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    backend_template_id TEXT NOT NULL,
    name TEXT NOT NULL,
    image TEXT NOT NULL DEFAULT '',
    writable_layer_mb INTEGER NOT NULL DEFAULT 0,
    vcpu INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    envd_port INTEGER NOT NULL DEFAULT 49983,
    agentd_port INTEGER NOT NULL DEFAULT 49984,
    probe_port INTEGER NOT NULL DEFAULT 0,
    backend_status TEXT NOT NULL DEFAULT 'unknown',
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE UNIQUE INDEX templates_backend_id ON templates (environment_id, backend_template_id);
CREATE TABLE agents (
    id BIGSERIAL PRIMARY KEY,
    department_id BIGINT REFERENCES departments(id) ON DELETE RESTRICT,
    name TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    config TEXT NOT NULL,
    sandbox_mode TEXT NOT NULL CHECK (sandbox_mode IN ('off', 'per-session')),
    template_id BIGINT REFERENCES templates(id) ON DELETE RESTRICT,
    default_environment_id BIGINT NOT NULL REFERENCES environments(id) ON DELETE RESTRICT,
    idle_timeout_seconds INTEGER NOT NULL,
    reclaim_after_seconds INTEGER NOT NULL,
    command_policy TEXT NOT NULL DEFAULT '[]',
    created_by TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE UNIQUE INDEX agents_name ON agents (name);
CREATE INDEX agents_department ON agents (department_id);
CREATE TABLE agent_environments (
    agent_id BIGINT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    environment_id BIGINT NOT NULL REFERENCES environments(id) ON DELETE RESTRICT,
    PRIMARY KEY (agent_id, environment_id)
);
CREATE INDEX agent_environments_env ON agent_environments (environment_id);
