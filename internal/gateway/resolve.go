package gateway

import (
	"context"
	"strconv"

	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// Terminal actions, as policies name them on a session's terminal object
// ("sessions/<id>/terminal").
const (
	ActExec       = "exec"
	ActRead       = "read"
	ActStdin      = "stdin"
	ActResize     = "resize"
	ActKill       = "kill"
	ActFilesRead  = "files.read"
	ActFilesFetch = "files.fetch"
	ActFilesWrite = "files.write"
)

// useActions make the session's environment do something; the others only
// read from it.
var useActions = map[string]bool{ActExec: true, ActStdin: true, ActResize: true, ActKill: true, ActFilesFetch: true, ActFilesRead: true, ActFilesWrite: true}

func terminalObject(sessionID int64) string {
	return "sessions/" + strconv.FormatInt(sessionID, 10) + "/terminal"
}

// resolve finds the session for act and authorizes it, with extra (nil:
// none) deciding too: use actions go through EnsureFor, which brings the
// session up only once both allowed it (a refused operation creates no
// sandbox and reaches no agentd); reads go through Locate.
func resolve(ctx context.Context, org Org, a *authz.Actor, sessionID int64, act string, extra func(sessions.Target) error) (sessions.Target, error) {
	check := func(t sessions.Target) error {
		if err := authorize(ctx, a, t, act); err != nil {
			return err
		}
		if extra != nil {
			return extra(t)
		}
		return nil
	}
	if useActions[act] {
		return org.Sessions.EnsureFor(ctx, a, sessionID, check)
	}
	t, err := org.Sessions.Locate(ctx, a, sessionID)
	if err != nil {
		return t, err
	}
	return t, check(t)
}

// resolveRecorded resolves a read of what the gateway recorded (a
// session's command history, a command's output). Unlike the operations it
// still works once the session closed or was lost: recordings outlive
// sessions. live reports whether agentd may still be asked.
func resolveRecorded(ctx context.Context, org Org, a *authz.Actor, sessionID int64) (t sessions.Target, live bool, err error) {
	t, err = org.Sessions.Locate(ctx, a, sessionID)
	// A session without a sandbox yet has a history too (empty, or what
	// ran before a reclaim put it back to pending): read like a final one.
	readable := sessions.IsFinal(err) || sessions.IsUnstarted(err)
	if err != nil && (!readable || t.Session.ID == 0) {
		return t, false, err
	}
	return t, err == nil, authorize(ctx, a, t, ActRead)
}

// authorize decides one terminal action. Policies decide first, and an
// explicit deny rule always wins; without a rule either way, the session's
// owner may do everything on its terminal (the session service already
// checked they may still use its agent). The owner is whoever
// sessions.Owns says: the session's user, one of their personal keys, or
// the service key that started it, so a key may run commands in every
// session it may create. Everybody else needs an allow: department owners
// and org admins hold one, auditors only for read.
func authorize(ctx context.Context, a *authz.Actor, t sessions.Target, act string) error {
	dom := authz.Domain(t.Session.AgentDepartmentID)
	obj := terminalObject(t.Session.ID)
	dec, err := a.Decide(ctx, dom, obj, act)
	if err != nil {
		return err
	}
	if dec.Allowed {
		return nil
	}
	if dec.Rule == "" && sessions.Owns(a, t.Session) {
		return nil
	}
	return a.Deny(authz.Denial{Target: sessions.AuditTarget(t.Session), Domain: dom, Object: obj, Action: act, Rule: authz.RuleText(dec)},
		"You may not "+act+" in session "+strconv.FormatInt(t.Session.ID, 10)+".")
}
