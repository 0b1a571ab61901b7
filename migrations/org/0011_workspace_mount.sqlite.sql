-- Workspace persistence: a sandbox environment may mount a host directory
-- per session (CubeSandbox's host-mount metadata key), so a session's
-- workspace outlives its sandbox. The session keeps the host path it was
-- given, so editing the environment never moves an existing workspace.
ALTER TABLE environments ADD COLUMN workspace_mount TEXT NOT NULL DEFAULT '';
ALTER TABLE environments ADD COLUMN workspace_mount_path TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN workspace_mount TEXT NOT NULL DEFAULT '';
