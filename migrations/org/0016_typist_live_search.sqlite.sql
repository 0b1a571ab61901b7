-- Who typed it, and live search.
-- actor_via: the credential a command's opener came through (an API key, or
-- a reference to the sign-in), as every stdin frame records its typist's.
-- text_cursor: how far the command's output is indexed for search (the
-- last chunk, the text's length, the escape stripper's state between
-- batches); recording_text is now written batch by batch as output is
-- stored, not only when the command ends, so the FTS5 index (external
-- content) follows updates too.
ALTER TABLE commands ADD COLUMN actor_via TEXT NOT NULL DEFAULT '';
ALTER TABLE commands ADD COLUMN text_cursor TEXT NOT NULL DEFAULT '';
CREATE TRIGGER recording_text_update AFTER UPDATE ON recording_text BEGIN INSERT INTO recording_fts (recording_fts, rowid, command, body) VALUES ('delete', old.command_id, old.command, old.body); INSERT INTO recording_fts (rowid, command, body) VALUES (new.command_id, new.command, new.body); END;
