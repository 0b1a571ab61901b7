-- A session is lost only when its environment stays unreachable for a
-- window (sessions.Runtime.UnreachableWindow), not after a count of failed
-- calls: a one-second network blip must not end it. unreachable_since is
-- when the current run of failures began (NULL while agentd answers);
-- every replica judges from this one shared time.
ALTER TABLE sessions ADD COLUMN unreachable_since TIMESTAMPTZ;
-- The last failure of the run: a failure long after it starts a new run,
-- so isolated failures hours apart never add up to a lost session.
ALTER TABLE sessions ADD COLUMN last_unreachable_at TIMESTAMPTZ;

-- A command is acknowledged once agentd answered its create (or any read
-- of it): before that, agentd not knowing the command means "not started
-- yet", and the create is sent again (its id is the console's, so that is
-- idempotent), never "lost". Commands recorded before this existed were
-- all acknowledged or ended.
ALTER TABLE commands ADD COLUMN agentd_acked BOOLEAN NOT NULL DEFAULT TRUE;

-- A session being closed refuses new commands from the moment its close
-- began (before its running commands are listed and killed), so nothing
-- started during the close outlives it.
ALTER TABLE sessions ADD COLUMN closing_at TIMESTAMPTZ;
