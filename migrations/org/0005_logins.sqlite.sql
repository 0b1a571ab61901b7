-- "Session" means an agent session; a user's sign-in is a login.
ALTER TABLE user_sessions RENAME TO user_logins;
DROP INDEX user_sessions_subject;
CREATE INDEX user_logins_subject ON user_logins (subject);
