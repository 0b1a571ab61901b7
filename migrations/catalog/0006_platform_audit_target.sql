-- The platform log's events by target, newest first: the checkpoint check
-- reads the newest audit.checkpoint recorded for an org (internal/anchor)
-- every minute, and walking the action index back to an idle org's last
-- one passes every other org's since. Target searches use it too.
CREATE INDEX platform_audit_target ON platform_audit_events (target_id, seq);
