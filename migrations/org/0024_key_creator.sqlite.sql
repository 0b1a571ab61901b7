-- The user who created an API key, by id (created_by keeps the name as
-- it was). NULL for keys created before this, or by no user. A service
-- key has no owner, so without it the person who minted the key could
-- approve the key's own approval requests.
ALTER TABLE api_keys ADD COLUMN created_by_user_id BIGINT;
-- The user who created the requesting key (a service key's creator), who
-- may not decide the request either.
ALTER TABLE approvals ADD COLUMN requester_creator_user_id BIGINT;
