-- Org provisioning and deletion are recorded before their side effects, so a
-- reconciler can finish or undo what a crash interrupted. SQLite cannot
-- change a CHECK constraint in place: rebuild the table.
CREATE TABLE organizations_new (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    slug TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('provisioning', 'active', 'suspended', 'deleting')),
    db_dialect TEXT NOT NULL,
    db_locator TEXT NOT NULL,
    db_attached BOOLEAN NOT NULL DEFAULT 0,
    created_at DATETIME NOT NULL,
    updated_at DATETIME NOT NULL,
    suspended_at DATETIME,
    provision_progress TEXT NOT NULL DEFAULT ''
);
INSERT INTO organizations_new (id, slug, name, status, db_dialect, db_locator, db_attached, created_at, updated_at, suspended_at)
SELECT id, slug, name, status, db_dialect, db_locator, db_attached, created_at, updated_at, suspended_at FROM organizations;
DROP TABLE organizations;
ALTER TABLE organizations_new RENAME TO organizations;
