-- "Session" means an agent session; a platform admin's sign-in is a login.
ALTER TABLE platform_sessions RENAME TO platform_logins;
