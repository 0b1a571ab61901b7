// Package views holds the templ components and pages. Views take plain view
// structs prepared by handlers; they never touch the database.
package views

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

func statusTitle(status int) string {
	switch status {
	case http.StatusNotFound:
		return "Not found"
	case http.StatusForbidden:
		return "Not allowed"
	case http.StatusUnauthorized:
		return "Sign-in required"
	case http.StatusTooManyRequests:
		return "Slow down"
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return "Check your input"
	case http.StatusServiceUnavailable:
		return "Temporarily unavailable"
	}
	if status >= 500 {
		return "Something went wrong"
	}
	return http.StatusText(status)
}

// When formats a time for tables: UTC, minute precision, machine-readable
// in the datetime attribute.
func When(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}

func iso(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// RoleName names a role for people: "org-admin" is what casbin stores,
// "Org admin" is what a page shows.
func RoleName(role string) string {
	switch role {
	case "org-admin":
		return "Org admin"
	case "auditor":
		return "Auditor"
	case "dept-owner":
		return "Department owner"
	case "member":
		return "Member"
	}
	return role
}

// RoleLabel is a role with where it applies, e.g. "Org admin (whole
// organization)" or "Department owner (Research)"; where is the domain's
// label ("whole organization", "department Research").
func RoleLabel(role, where string) string {
	if where == "" {
		return RoleName(role)
	}
	return RoleName(role) + " (" + strings.TrimPrefix(where, "department ") + ")"
}

func userURL(slug string, id int64, suffix string) string {
	return "/o/" + slug + "/users/" + strconv.FormatInt(id, 10) + suffix
}

func agentURL(slug string, id int64, suffix string) string {
	return "/o/" + slug + "/agents/" + strconv.FormatInt(id, 10) + suffix
}

func deptURL(slug string, id int64, suffix string) string {
	return "/o/" + slug + "/departments/" + strconv.FormatInt(id, 10) + suffix
}

// removeRoleConsequence says what removing a role takes away, in the
// strongest terms for the strongest roles.
func removeRoleConsequence(email string, r RoleRow) string {
	switch r.Role {
	case "org-admin":
		return email + " stops being an org admin at once: no more managing users, roles, departments or settings. (A platform admin can still enter the organization to restore one.)"
	case "auditor":
		return email + " can no longer read the audit log or recordings."
	}
	return email + " loses what " + RoleLabel(r.Role, r.Domain) + " gave them at once: its agents, environments and sessions."
}

// hasSandboxChoice reports whether any offered environment is a sandbox
// backend, which the agent form offers only for per-session mode.
func hasSandboxChoice(es []EnvChoice) bool {
	for _, e := range es {
		if e.Sandbox {
			return true
		}
	}
	return false
}
