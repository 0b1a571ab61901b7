-- Signed checkpoints of each org's audit chain head, kept outside the org's
-- database (internal/anchor): verifying an org's log against them shows
-- events cut off its end or an older copy of its database restored. Each
-- org signs with its own Ed25519 key, whose seed is sealed under the master
-- key. Both go with the org when it is deleted (foreign keys are on; a
-- later migration that rebuilds organizations with DROP TABLE would delete
-- them too, so it must keep these rows aside first).
CREATE TABLE audit_anchor_keys (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    org_id INTEGER NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    key_id TEXT NOT NULL,
    public_key TEXT NOT NULL,
    sealed_key TEXT NOT NULL,
    created_at DATETIME NOT NULL,
    UNIQUE (org_id, key_id)
);
CREATE TABLE audit_anchors (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    org_id INTEGER NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    seq BIGINT NOT NULL,
    hash TEXT NOT NULL,
    taken_at DATETIME NOT NULL,
    key_id TEXT NOT NULL,
    signature TEXT NOT NULL,
    UNIQUE (org_id, seq)
);
