-- Commands run through the terminal gateway and their recordings: output
-- and input chunks in compressed frames, hash-chained per command.
CREATE TABLE commands (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id BIGINT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    agentd_id TEXT NOT NULL,
    command TEXT NOT NULL,
    cwd TEXT NOT NULL DEFAULT '',
    tty BOOLEAN NOT NULL DEFAULT FALSE,
    actor_type TEXT NOT NULL,
    actor_id TEXT NOT NULL,
    actor_name TEXT NOT NULL,
    started_at DATETIME NOT NULL,
    ended_at DATETIME,
    exit_code INTEGER,
    state TEXT NOT NULL CHECK (state IN ('running', 'exited', 'timed_out', 'killed', 'lost')),
    reason TEXT NOT NULL DEFAULT '',
    out_bytes BIGINT NOT NULL DEFAULT 0,
    in_bytes BIGINT NOT NULL DEFAULT 0,
    dropped_bytes BIGINT NOT NULL DEFAULT 0,
    truncated BOOLEAN NOT NULL DEFAULT FALSE,
    last_chunk BIGINT NOT NULL DEFAULT 0,
    out_hash TEXT NOT NULL DEFAULT '',
    in_seq BIGINT NOT NULL DEFAULT 0,
    in_hash TEXT NOT NULL DEFAULT '',
    stdin_content BOOLEAN NOT NULL DEFAULT TRUE,
    lease_owner TEXT NOT NULL DEFAULT '',
    lease_until DATETIME
);
CREATE UNIQUE INDEX commands_agentd ON commands (agentd_id);
CREATE INDEX commands_session ON commands (session_id, id);
CREATE INDEX commands_running ON commands (state, lease_until);
CREATE TABLE recording_frames (
    command_id BIGINT NOT NULL REFERENCES commands(id) ON DELETE CASCADE,
    kind TEXT NOT NULL CHECK (kind IN ('out', 'in')),
    first_seq BIGINT NOT NULL,
    last_seq BIGINT NOT NULL,
    started_at DATETIME NOT NULL,
    raw_bytes INTEGER NOT NULL,
    body BLOB NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    PRIMARY KEY (command_id, kind, first_seq)
);
