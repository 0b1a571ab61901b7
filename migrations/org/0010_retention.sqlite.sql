-- Retention: expired audit events are archived (gzip JSONL with the
-- chain's hashes) and removed; the checkpoint carries the last removed
-- event's seq and hash so the remaining chain still verifies from it.
CREATE TABLE audit_checkpoints (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    through_seq BIGINT NOT NULL,
    through_hash TEXT NOT NULL,
    created_at DATETIME NOT NULL
);
CREATE TABLE audit_archives (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at DATETIME NOT NULL,
    first_seq BIGINT NOT NULL,
    last_seq BIGINT NOT NULL,
    first_prev_hash TEXT NOT NULL,
    last_hash TEXT NOT NULL,
    events BIGINT NOT NULL,
    body BLOB NOT NULL
);
-- Set when retention removed a command's recording (frames and search
-- text); the command row stays, and verification skips its recording.
ALTER TABLE commands ADD COLUMN recording_removed_at DATETIME;
CREATE INDEX commands_ended ON commands (ended_at);
