-- What an environment's agentd said of exec reporting at its last health
-- check: "netlink" (programs started in sessions are reported from the
-- kernel), "unavailable" or "off" (then exec_reporting_reason says why),
-- or "" (never checked, a sandbox backend, or an agentd older than exec
-- reporting). The environment's page shows it: where it is not "netlink",
-- interactive terminals are audited by the shell's own marks only.
ALTER TABLE environments ADD COLUMN exec_reporting TEXT NOT NULL DEFAULT '';
ALTER TABLE environments ADD COLUMN exec_reporting_reason TEXT NOT NULL DEFAULT '';
