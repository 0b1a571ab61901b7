-- Retention: expired audit events are archived (gzip JSONL with the
-- chain's hashes) and removed; the checkpoint carries the last removed
-- event's seq and hash so the remaining chain still verifies from it.
CREATE TABLE audit_checkpoints (
    id BIGSERIAL PRIMARY KEY,
    through_seq BIGINT NOT NULL,
    through_hash TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE audit_archives (
    id BIGSERIAL PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL,
    first_seq BIGINT NOT NULL,
    last_seq BIGINT NOT NULL,
    first_prev_hash TEXT NOT NULL,
    last_hash TEXT NOT NULL,
    events BIGINT NOT NULL,
    body BYTEA NOT NULL
);
-- Set when retention removed a command's recording (frames and search
-- text); the command row stays, and verification skips its recording.
ALTER TABLE commands ADD COLUMN recording_removed_at TIMESTAMPTZ;
CREATE INDEX commands_ended ON commands (ended_at);
