-- Org provisioning and deletion are recorded before their side effects, so a
-- reconciler can finish or undo what a crash interrupted.
ALTER TABLE organizations DROP CONSTRAINT organizations_status_check;
ALTER TABLE organizations ADD CONSTRAINT organizations_status_check CHECK (status IN ('provisioning', 'active', 'suspended', 'deleting'));
ALTER TABLE organizations ADD COLUMN provision_progress TEXT NOT NULL DEFAULT '';
