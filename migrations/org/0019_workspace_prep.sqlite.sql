-- Skill bundles and files uploaded to an agent, kept in the org's own
-- database (not a directory beside it): replicas share it, it is backed up
-- and deleted with the org, and no other org's handle reaches it. Contents
-- never leave the console except into a session's workspace through agentd.
CREATE TABLE agent_uploads (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent_id BIGINT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    kind TEXT NOT NULL CHECK (kind IN ('skill', 'file')),
    -- name: a skill bundle's name (config.skills[].source "upload:<name>"),
    -- or a file's path in the workspace (relative, no "..").
    name TEXT NOT NULL,
    format TEXT NOT NULL DEFAULT '',
    size BIGINT NOT NULL,
    sha256 TEXT NOT NULL,
    content BLOB NOT NULL,
    created_by TEXT NOT NULL,
    created_at DATETIME NOT NULL,
    updated_at DATETIME NOT NULL
);
CREATE UNIQUE INDEX agent_uploads_name ON agent_uploads (agent_id, kind, name);

-- What was put in a session's workspace and proven there. workspace names
-- the workspace prepared (a sandbox, a host directory, or a persistent
-- directory mounted into the session's sandboxes): a session whose
-- workspace changes is prepared again. sandbox_id is the sandbox it was
-- last proven in: a new sandbox over a persistent directory is checked
-- (one batch stat), not rewritten. claim_token and
-- claimed_at let one caller of any replica prepare at a time.
CREATE TABLE session_preparations (
    session_id BIGINT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
    workspace TEXT NOT NULL DEFAULT '',
    sandbox_id TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT '',
    items TEXT NOT NULL DEFAULT '[]',
    claim_token TEXT NOT NULL DEFAULT '',
    claimed_at DATETIME,
    prepared_at DATETIME,
    updated_at DATETIME NOT NULL
);
