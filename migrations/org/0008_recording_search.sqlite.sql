-- Recording search: per ended command, its command line and its output with
-- terminal escapes removed (at most recordings.IndexCap bytes), written in the
-- transaction that records the command's end. "times" maps offsets in body to
-- moments of the recording, so a match links to the replay where it happened.
-- An FTS5 index over it (external content: the text is stored once), kept in
-- step by triggers.
CREATE TABLE recording_text (
    command_id INTEGER PRIMARY KEY REFERENCES commands(id) ON DELETE CASCADE,
    command TEXT NOT NULL,
    body TEXT NOT NULL,
    times TEXT NOT NULL DEFAULT '',
    capped BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE VIRTUAL TABLE recording_fts USING fts5(command, body, content='recording_text', content_rowid='command_id', tokenize='unicode61');
CREATE TRIGGER recording_text_insert AFTER INSERT ON recording_text BEGIN INSERT INTO recording_fts (rowid, command, body) VALUES (new.command_id, new.command, new.body); END;
CREATE TRIGGER recording_text_delete AFTER DELETE ON recording_text BEGIN INSERT INTO recording_fts (recording_fts, rowid, command, body) VALUES ('delete', old.command_id, old.command, old.body); END;
CREATE INDEX commands_started ON commands (started_at, id);
