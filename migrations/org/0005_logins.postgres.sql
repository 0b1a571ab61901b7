-- "Session" means an agent session; a user's sign-in is a login.
ALTER TABLE user_sessions RENAME TO user_logins;
ALTER INDEX user_sessions_subject RENAME TO user_logins_subject;
