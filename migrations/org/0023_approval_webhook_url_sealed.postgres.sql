-- A webhook's URL is often a credential itself (a chat service's
-- incoming-webhook path): the whole address is now stored sealed, like the
-- secret, in url_sealed, and url keeps only its origin (scheme://host), the
-- part that is shown and audited; path_set says whether more followed.
-- A webhook set before this stored its URL in the clear and cannot be
-- sealed here: it is removed, and an org admin sets it again.
DELETE FROM approval_webhooks;
ALTER TABLE approval_webhooks ADD COLUMN url_sealed TEXT NOT NULL DEFAULT '';
ALTER TABLE approval_webhooks ADD COLUMN path_set BOOLEAN NOT NULL DEFAULT FALSE;
