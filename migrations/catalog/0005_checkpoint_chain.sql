-- Each checkpoint signs the sequence number of the checkpoint before it
-- (0 for an org's first), so a checkpoint deleted from the middle of the
-- kept ones shows as a gap in the signed chain. Rows written before this
-- column existed keep NULL and the signed text without it.
ALTER TABLE audit_anchors ADD COLUMN prev_seq BIGINT;
