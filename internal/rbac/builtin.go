package rbac

// BuiltinSubject reports whether sub is a subject every org has by
// construction: the platform admins' subject or a built-in role. Org
// rules and assignments may not target them: a deny on "platform-admin"
// (or on "org-admin", which platform admins hold) would lock the platform
// out of the org, and a rule on a role would redefine it for everyone,
// while the built-in groupings already cannot be removed.
func BuiltinSubject(sub string) bool {
	switch sub {
	case PlatformSubject, RoleOrgAdmin, RoleDeptOwner, RoleMember, RoleAuditor:
		return true
	}
	return false
}
