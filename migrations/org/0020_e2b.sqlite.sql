-- E2B-compatible control plane. An e2b key is an API key of its owner
-- bound to one agent (agent_id set; token e2b_<hex>): it authenticates only
-- the E2B control plane, as its owner, on that agent's sessions. Deleting
-- the agent deletes its keys.
ALTER TABLE api_keys ADD COLUMN agent_id BIGINT REFERENCES agents(id) ON DELETE CASCADE;
-- One row per session created through the E2B API: the sandbox id the SDK
-- sees (<org-slug>-<20 hex>, never the backend's), the key that created
-- it, and the envd access token the console minted for it, sealed because
-- connect answers it again.
CREATE TABLE e2b_sandboxes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id BIGINT NOT NULL UNIQUE REFERENCES sessions(id) ON DELETE CASCADE,
    sandbox_id TEXT NOT NULL UNIQUE,
    key_id BIGINT NOT NULL REFERENCES api_keys(id) ON DELETE CASCADE,
    agent_id BIGINT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    template_id TEXT NOT NULL DEFAULT '',
    metadata TEXT NOT NULL DEFAULT '{}',
    token_sealed TEXT NOT NULL,
    timeout_seconds INTEGER NOT NULL DEFAULT 0,
    end_at DATETIME,
    created_at DATETIME NOT NULL
);
CREATE INDEX e2b_sandboxes_agent ON e2b_sandboxes (agent_id, id);
