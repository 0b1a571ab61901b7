-- Recording search: per ended command, its command line and its output with
-- terminal escapes removed (at most recordings.IndexCap bytes), written in the
-- transaction that records the command's end. "times" maps offsets in body to
-- moments of the recording, so a match links to the replay where it happened.
-- Full text over the 'simple' configuration (no stemming: terminal output is
-- not prose; words are found as typed), with a GIN index. No extension needed.
CREATE TABLE recording_text (
    command_id BIGINT PRIMARY KEY REFERENCES commands(id) ON DELETE CASCADE,
    command TEXT NOT NULL,
    body TEXT NOT NULL,
    times TEXT NOT NULL DEFAULT '',
    capped BOOLEAN NOT NULL DEFAULT FALSE,
    search tsvector GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, command || ' ' || body)) STORED
);
CREATE INDEX recording_text_search ON recording_text USING gin (search);
CREATE INDEX commands_started ON commands (started_at, id);
