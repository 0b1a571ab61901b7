-- An agent's execution policy (internal/policy.Exec) as canonical JSON,
-- and its SHA-256 digest, which names the version an exec was decided by.
-- '' for an agent saved before execution policies: its command_policy
-- patterns are read as text deny rules (policy.FromPatterns), so it keeps
-- denying exactly what it denied, and its next save stores them here.
-- command_policy stays, holding the text deny patterns of exec_policy, for
-- clients that still read it.
ALTER TABLE agents ADD COLUMN exec_policy TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN exec_policy_digest TEXT NOT NULL DEFAULT '';
