-- config_version is bumped by every write to agents, agent_environments and
-- environments, in the writer's transaction (a gorm callback on the org's
-- database handle: see internal/sessions/freshness.go). Each replica's
-- session cache remembers the version its entries were read at and reads
-- the current one at most once a second per org, so a command policy or an
-- environment's address changed on one replica is obeyed on every replica
-- within a second.
CREATE TABLE config_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO config_version (id, version) VALUES (1, 1);
