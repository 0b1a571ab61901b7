-- One agentd token per sandbox: right after creating a session's sandbox
-- the console rekeys its agentd (POST /v1/token, authenticated with the
-- template's token) to a random token of its own, sealed here under the
-- master key (bound to the org, the session and the sandbox id). It is
-- used for that sandbox only. agentd_token_kind says which token the
-- session's sandbox takes: "per_sandbox", "template" (its agentd is too
-- old to be rekeyed) or "" (a host session, or no sandbox yet).
ALTER TABLE sessions ADD COLUMN sealed_agentd_token TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN agentd_token_kind TEXT NOT NULL DEFAULT '';
