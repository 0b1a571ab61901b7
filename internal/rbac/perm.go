// Package rbac decides who may do what: the permission each route declares,
// the casbin model and the per-org enforcers.
package rbac

import "strings"

// Scope says which authority a route answers to.
type Scope int

// Scopes. The zero value is invalid so an undeclared route cannot slip
// through as "public".
const (
	_ Scope = iota // zero: undeclared, never valid
	// ScopePublic routes need no principal (login, health, static files).
	ScopePublic
	// ScopeAuthenticated routes need any signed-in principal of the surface
	// but no particular permission (logout, change own password).
	ScopeAuthenticated
	// ScopeOwnLogin routes concern the caller's own sign-in (change the
	// password, sign out, who am I). They are the only routes a principal
	// signed in with a one-time password may reach.
	ScopeOwnLogin
	// ScopePlatform routes need a platform admin.
	ScopePlatform
	// ScopeOrg routes need a casbin allow in the org of the URL.
	ScopeOrg
)

// Perm is what a route requires. Object may contain :param placeholders
// filled from the route's path parameters at request time, e.g.
// "agents/:id".
type Perm struct {
	Scope  Scope
	Object string
	Action string
}

// Valid reports whether p was declared through one of the constructors.
func (p Perm) Valid() bool {
	switch p.Scope {
	case ScopePublic, ScopeAuthenticated, ScopeOwnLogin:
		return true
	case ScopePlatform, ScopeOrg:
		return p.Object != "" && p.Action != ""
	}
	return false
}

// String is used in the route table listing and in denial audit records.
func (p Perm) String() string {
	switch p.Scope {
	case ScopePublic:
		return "public"
	case ScopeAuthenticated:
		return "authenticated"
	case ScopeOwnLogin:
		return "own-login"
	case ScopePlatform:
		return "platform:" + p.Object + ":" + p.Action
	case ScopeOrg:
		return "org:" + p.Object + ":" + p.Action
	}
	return "undeclared"
}

// Public declares a route open to anyone.
func Public() Perm { return Perm{Scope: ScopePublic} }

// Authenticated declares a route open to any signed-in principal.
func Authenticated() Perm { return Perm{Scope: ScopeAuthenticated} }

// OwnLogin declares a route about the caller's own sign-in, reachable even
// before a one-time password is changed.
func OwnLogin() Perm { return Perm{Scope: ScopeOwnLogin} }

// SignedIn reports whether p needs a principal but no permission.
func (p Perm) SignedIn() bool { return p.Scope == ScopeAuthenticated || p.Scope == ScopeOwnLogin }

// Platform declares a platform-admin route.
func Platform(object, action string) Perm {
	return Perm{Scope: ScopePlatform, Object: object, Action: action}
}

// Org declares an org route checked by casbin.
func Org(object, action string) Perm { return Perm{Scope: ScopeOrg, Object: object, Action: action} }

// Resolve fills :param placeholders in p.Object using param.
func (p Perm) Resolve(param func(string) string) string {
	if !strings.Contains(p.Object, ":") {
		return p.Object
	}
	parts := strings.Split(p.Object, "/")
	for i, s := range parts {
		if strings.HasPrefix(s, ":") {
			parts[i] = param(s[1:])
		}
	}
	return strings.Join(parts, "/")
}
