-- Caps on open sessions and running commands (sessions.Limits,
-- proxy.CommandLimits) count, inside the creating transaction, a user's,
-- a service key's or an agent's open sessions and the running commands of
-- those. These partial indexes hold only open sessions and running
-- commands, so the counts stay small however many closed sessions and
-- ended commands an org keeps. Their predicates are the queries' own,
-- written out the same way.
CREATE INDEX sessions_open_user ON sessions (user_id) WHERE state NOT IN ('closed', 'lost');
CREATE INDEX sessions_open_subject ON sessions (subject) WHERE state NOT IN ('closed', 'lost');
CREATE INDEX sessions_open_agent ON sessions (agent_id) WHERE state NOT IN ('closed', 'lost');
CREATE INDEX commands_running_session ON commands (session_id) WHERE state = 'running';
