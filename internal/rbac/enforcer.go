package rbac

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/casbin/casbin/v2"
	"github.com/casbin/casbin/v2/model"
	gormadapter "github.com/casbin/gorm-adapter/v3"
	"gorm.io/gorm"
)

//go:embed model.conf
var modelText string

// Built-in roles.
const (
	RoleOrgAdmin  = "org-admin"
	RoleDeptOwner = "dept-owner"
	RoleMember    = "member"
	RoleAuditor   = "auditor"
)

// DomainOrg is the org-wide domain.
const DomainOrg = "org"

// DeptDomain names a department's domain.
func DeptDomain(id int64) string { return fmt.Sprintf("dept:%d", id) }

// Subjects.
const (
	// PlatformSubject is how a platform admin who entered the org is
	// enforced: as an org-admin, through a built-in grouping rule.
	PlatformSubject = "platform-admin"
)

// UserSubject and KeySubject name principals in policies.
func UserSubject(id int64) string { return fmt.Sprintf("user:%d", id) }

// KeySubject names a service API key.
func KeySubject(id int64) string { return fmt.Sprintf("key:%d", id) }

// builtinPolicies are the role definitions every org starts with. They are
// written on first load and restored if deleted; org admins add
// assignments and deny rules beside them.
var builtinPolicies = [][]string{
	{RoleOrgAdmin, "*", "*", "*", "allow"},
	{RoleAuditor, DomainOrg, "audit", "read", "allow"},
	{RoleAuditor, DomainOrg, "audit", "export", "allow"},
	{RoleAuditor, DomainOrg, "audit", "verify", "allow"},
	{RoleAuditor, DomainOrg, "recordings", "read", "allow"},
	{RoleAuditor, DomainOrg, "recordings/*", "read", "allow"},
	// Auditors read every agent session (not use it).
	{RoleAuditor, DomainOrg, "sessions", "read", "allow"},
	// Auditors read every session and its terminal, whatever department
	// its agent belongs to.
	{RoleAuditor, "*", "sessions/*", "read", "allow"},
	// One visibility rule for what a session stands on: an auditor who
	// reads every session reads every agent and environment (and its
	// templates) too, in any department, private ones included. Never
	// their secrets: no page or answer carries those to any reader.
	{RoleAuditor, "*", "agents", "read", "allow"},
	{RoleAuditor, "*", "agents/*", "read", "allow"},
	{RoleAuditor, "*", "environments", "read", "allow"},
	{RoleAuditor, "*", "environments/*", "read", "allow"},
	{RoleAuditor, "*", "templates", "read", "allow"},
	{RoleAuditor, "*", "templates/*", "read", "allow"},
	// Auditors read approval requests in every department, never decide.
	{RoleAuditor, "*", "approvals", "read", "allow"},
	// Department owners run their department: its members and what
	// belongs to it.
	{RoleDeptOwner, "dept:*", "departments", "read", "allow"},
	{RoleDeptOwner, "dept:*", "departments/*", "read", "allow"},
	{RoleDeptOwner, "dept:*", "departments/*", "update", "allow"},
	{RoleDeptOwner, "dept:*", "members", "*", "allow"},
	{RoleDeptOwner, "dept:*", "agents", "*", "allow"},
	{RoleDeptOwner, "dept:*", "agents/*", "*", "allow"},
	{RoleDeptOwner, "dept:*", "environments", "*", "allow"},
	{RoleDeptOwner, "dept:*", "environments/*", "*", "allow"},
	{RoleDeptOwner, "dept:*", "templates", "*", "allow"},
	{RoleDeptOwner, "dept:*", "templates/*", "*", "allow"},
	{RoleDeptOwner, "dept:*", "sessions", "*", "allow"},
	{RoleDeptOwner, "dept:*", "sessions/*", "*", "allow"},
	// Department owners decide the approval requests of their
	// department's agents (approvals:decide), and read them.
	{RoleDeptOwner, "dept:*", "approvals", "decide", "allow"},
	{RoleDeptOwner, "dept:*", "approvals", "read", "allow"},
	// Members see their department and use what it offers.
	{RoleMember, "dept:*", "departments", "read", "allow"},
	{RoleMember, "dept:*", "departments/*", "read", "allow"},
	{RoleMember, "dept:*", "members", "read", "allow"},
	{RoleMember, "dept:*", "agents", "read", "allow"},
	{RoleMember, "dept:*", "agents/*", "read", "allow"},
	{RoleMember, "dept:*", "agents/*", "use", "allow"},
	{RoleMember, "dept:*", "environments", "read", "allow"},
	{RoleMember, "dept:*", "environments/*", "read", "allow"},
	{RoleMember, "dept:*", "templates", "read", "allow"},
	{RoleMember, "dept:*", "templates/*", "read", "allow"},
	{RoleMember, "dept:*", "sessions", "create", "allow"},
}

var builtinGrouping = [][]string{
	{PlatformSubject, RoleOrgAdmin, DomainOrg},
}

// Enforcer is one org's casbin enforcer with cross-replica reload: every
// policy change bumps policy_version in the org database, and Enforce
// reloads when the stored version moved (checked at most every
// CheckEvery, one second: a role change reaches every replica within it).
type Enforcer struct {
	db         *gorm.DB
	mu         sync.RWMutex
	e          *casbin.Enforcer
	version    int64
	checkedAt  time.Time
	CheckEvery time.Duration
	now        func() time.Time
	// decided caches decisions of the policies loaded now: casbin's
	// matcher costs about a quarter of a millisecond per check, and the
	// gateway checks every keystroke. Every change of the loaded policies
	// takes mu for writing and empties it (lock); decisions are stored
	// under the read lock, so none outlives the policies it came from.
	decidedMu sync.Mutex
	decided   map[decisionKey]Decision
}

type decisionKey struct{ sub, dom, obj, act string }

// maxDecided bounds the decision cache; a full one starts over.
const maxDecided = 4096

// lock takes mu for a change of the loaded policies and forgets every
// cached decision.
func (en *Enforcer) lock() {
	en.mu.Lock()
	en.forgetDecisions()
}

// forgetDecisions empties the decision cache; mu must be held for writing.
func (en *Enforcer) forgetDecisions() {
	en.decidedMu.Lock()
	en.decided = nil
	en.decidedMu.Unlock()
}

// NewEnforcer loads the org's policies, installing the built-in ones.
func NewEnforcer(ctx context.Context, db *gorm.DB) (*Enforcer, error) {
	m, err := model.NewModelFromString(modelText)
	if err != nil {
		return nil, fmt.Errorf("casbin model: %w", err)
	}
	// The adapter keeps db's session; give it its own so TurnOffAutoMigrate
	// does not change the caller's handle. The table is owned by a migration.
	adb := db.Session(&gorm.Session{NewDB: true})
	gormadapter.TurnOffAutoMigrate(adb)
	a, err := gormadapter.NewAdapterByDB(adb)
	if err != nil {
		return nil, fmt.Errorf("casbin adapter: %w", err)
	}
	en := &Enforcer{db: db, CheckEvery: time.Second, now: time.Now}
	// The version is read before the policies are loaded: a change that
	// lands in between then shows as a newer version at the next check and
	// is loaded. Read after, it would be taken for what was loaded, and
	// this replica would decide on the older policies until the next
	// change (a role assigned while another replica first opened the org
	// would be refused there for good).
	loaded, err := en.readVersion(ctx)
	if err != nil {
		return nil, err
	}
	ce, err := casbin.NewEnforcer(m, a)
	if err != nil {
		return nil, fmt.Errorf("casbin enforcer: %w", err)
	}
	en.e = ce
	if err := en.installBuiltins(ctx, loaded); err != nil {
		return nil, err
	}
	return en, nil
}

// installBuiltins adds the built-in policies the loaded ones lack; loaded
// is the version read before they were loaded.
func (en *Enforcer) installBuiltins(ctx context.Context, loaded int64) error {
	en.lock()
	defer en.mu.Unlock()
	changed := false
	for _, p := range builtinPolicies {
		has, err := en.e.HasPolicy(toIface(p)...)
		if err != nil {
			return fmt.Errorf("read built-in policy: %w", err)
		}
		if !has {
			if _, err := en.e.AddPolicy(toIface(p)...); err != nil {
				return fmt.Errorf("install built-in policy: %w", err)
			}
			changed = true
		}
	}
	for _, g := range builtinGrouping {
		has, err := en.e.HasGroupingPolicy(toIface(g)...)
		if err != nil {
			return fmt.Errorf("read built-in grouping: %w", err)
		}
		if !has {
			if _, err := en.e.AddGroupingPolicy(toIface(g)...); err != nil {
				return fmt.Errorf("install built-in grouping: %w", err)
			}
			changed = true
		}
	}
	if changed {
		// Other replicas reload; this one keeps the version it loaded at,
		// so it reloads once too, taking in whatever changed meanwhile.
		if _, err := en.bump(ctx); err != nil {
			return err
		}
	}
	en.version, en.checkedAt = loaded, en.now()
	return nil
}

func toIface(xs []string) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

func (en *Enforcer) readVersion(ctx context.Context) (int64, error) {
	var v int64
	if err := en.db.WithContext(ctx).Raw("SELECT version FROM policy_version WHERE id = 1").Scan(&v).Error; err != nil {
		return 0, fmt.Errorf("read policy version: %w", err)
	}
	return v, nil
}

// bump moves the stored version on and returns the new one, in one
// statement (read separately, it could include another replica's bump).
func (en *Enforcer) bump(ctx context.Context) (int64, error) {
	var v int64
	if err := en.db.WithContext(ctx).Raw("UPDATE policy_version SET version = version + 1 WHERE id = 1 RETURNING version").Scan(&v).Error; err != nil {
		return 0, fmt.Errorf("bump policy version: %w", err)
	}
	return v, nil
}

// SetCheckEvery sets how stale the cached policy may be before the stored
// version is read again (0: on every check).
func (en *Enforcer) SetCheckEvery(d time.Duration) {
	en.mu.Lock()
	defer en.mu.Unlock()
	en.CheckEvery = d
}

// refresh reloads policies when another replica changed them.
func (en *Enforcer) refresh(ctx context.Context) error {
	en.mu.RLock()
	fresh := en.now().Sub(en.checkedAt) < en.CheckEvery
	en.mu.RUnlock()
	if fresh {
		return nil
	}
	v, err := en.readVersion(ctx)
	if err != nil {
		return err
	}
	en.mu.Lock()
	defer en.mu.Unlock()
	if v != en.version {
		en.forgetDecisions()
		if err := en.e.LoadPolicy(); err != nil {
			return fmt.Errorf("reload policy: %w", err)
		}
		en.version = v
	}
	en.checkedAt = en.now()
	return nil
}

// Allowed reports whether sub may act on obj in dom. An error is a failed
// check, never a denial: callers answer it with a 500.
func (en *Enforcer) Allowed(ctx context.Context, sub, dom, obj, act string) (bool, error) {
	d, err := en.Decide(ctx, sub, dom, obj, act)
	return d.Allowed, err
}

// Decision is one enforcement and the rule that decided it.
type Decision struct {
	Allowed bool
	// Rule is the policy that decided, as "sub, dom, obj, act, eft"; empty
	// when nothing matched and the default (deny) applied.
	Rule string
}

// Decide is Allowed with the deciding rule, for denial audit records.
func (en *Enforcer) Decide(ctx context.Context, sub, dom, obj, act string) (Decision, error) {
	if err := en.refresh(ctx); err != nil {
		return Decision{}, err
	}
	en.mu.RLock()
	defer en.mu.RUnlock()
	k := decisionKey{sub, dom, obj, act}
	en.decidedMu.Lock()
	d, ok := en.decided[k]
	en.decidedMu.Unlock()
	if ok {
		return d, nil
	}
	allowed, explain, err := en.e.EnforceEx(sub, dom, obj, act)
	if err != nil {
		return Decision{}, fmt.Errorf("enforce: %w", err)
	}
	d = Decision{Allowed: allowed, Rule: strings.Join(explain, ", ")}
	en.decidedMu.Lock()
	if en.decided == nil || len(en.decided) >= maxDecided {
		en.decided = make(map[decisionKey]Decision)
	}
	en.decided[k] = d
	en.decidedMu.Unlock()
	return d, nil
}

// AllowedAnywhere reports whether sub may act on obj in the org domain or
// in any department domain it holds a role in (used for listings, which
// are then filtered per department).
func (en *Enforcer) AllowedAnywhere(ctx context.Context, sub, obj, act string) (bool, error) {
	d, err := en.DecideAnywhere(ctx, sub, obj, act)
	return d.Allowed, err
}

// DecideAnywhere is AllowedAnywhere with the deciding rule (the org
// domain's when nothing allows).
func (en *Enforcer) DecideAnywhere(ctx context.Context, sub, obj, act string) (Decision, error) {
	first, err := en.Decide(ctx, sub, DomainOrg, obj, act)
	if err != nil || first.Allowed {
		return first, err
	}
	doms, err := en.DomainsOf(sub)
	if err != nil {
		return Decision{}, err
	}
	for _, d := range doms {
		dec, err := en.Decide(ctx, sub, d, obj, act)
		if err != nil || dec.Allowed {
			return dec, err
		}
	}
	return first, nil
}

// Assignment is one role held by a subject in a domain.
type Assignment struct {
	Subject string `json:"subject"`
	Role    string `json:"role"`
	Domain  string `json:"domain"`
}

// DomainsOf lists the department domains sub holds any role in.
func (en *Enforcer) DomainsOf(sub string) ([]string, error) {
	en.mu.RLock()
	defer en.mu.RUnlock()
	rules, err := en.e.GetFilteredGroupingPolicy(0, sub)
	if err != nil {
		return nil, fmt.Errorf("read roles of %s: %w", sub, err)
	}
	seen := map[string]bool{}
	var out []string
	for _, r := range rules {
		if len(r) >= 3 && strings.HasPrefix(r[2], "dept:") && !seen[r[2]] {
			seen[r[2]] = true
			out = append(out, r[2])
		}
	}
	sort.Strings(out)
	return out, nil
}

// Assignments lists role assignments, optionally for one subject or domain
// ("" = all). Built-in grouping rules are left out.
func (en *Enforcer) Assignments(subject, domain string) ([]Assignment, error) {
	en.mu.RLock()
	defer en.mu.RUnlock()
	rules, err := en.e.GetGroupingPolicy()
	if err != nil {
		return nil, fmt.Errorf("read role assignments: %w", err)
	}
	var out []Assignment
	for _, r := range rules {
		if len(r) < 3 || r[0] == PlatformSubject {
			continue
		}
		if (subject == "" || r[0] == subject) && (domain == "" || r[2] == domain) {
			out = append(out, Assignment{Subject: r[0], Role: r[1], Domain: r[2]})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Domain != out[j].Domain {
			return out[i].Domain < out[j].Domain
		}
		return out[i].Subject < out[j].Subject
	})
	return out, nil
}

// Assign gives sub role in dom. It reports whether anything changed.
// Built-in subjects get no further roles (ErrBuiltin).
func (en *Enforcer) Assign(ctx context.Context, a Assignment) (bool, error) {
	if BuiltinSubject(a.Subject) {
		return false, ErrBuiltin
	}
	en.lock()
	ok, err := en.e.AddGroupingPolicy(a.Subject, a.Role, a.Domain)
	en.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("assign role: %w", err)
	}
	return ok, en.changed(ctx, ok)
}

// ErrBuiltin refuses changes to the built-in role definitions and the
// platform admins' access, which every org must keep.
var ErrBuiltin = errors.New("built-in rule")

func isBuiltin(rules [][]string, rule ...string) bool {
	for _, b := range rules {
		if strings.Join(b, "\x00") == strings.Join(rule, "\x00") {
			return true
		}
	}
	return false
}

// errEmptyField refuses a removal with an empty field: the adapter reads
// empty as "any" and would delete every matching row of the table.
var errEmptyField = errors.New("rbac: a removal needs every field")

// Unassign removes a role assignment. One that does not exist changes
// nothing and reports false.
func (en *Enforcer) Unassign(ctx context.Context, a Assignment) (bool, error) {
	if isBuiltin(builtinGrouping, a.Subject, a.Role, a.Domain) {
		return false, ErrBuiltin
	}
	en.lock()
	ok, err := en.removeExisting(true, a.Subject, a.Role, a.Domain)
	en.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("remove role: %w", err)
	}
	return ok, en.changed(ctx, ok)
}

// SetRoles makes roles exactly the roles sub holds in dom (used to put an
// assignment back when its audit record could not be written).
func (en *Enforcer) SetRoles(ctx context.Context, sub, dom string, roles []string) error {
	if sub == "" || dom == "" {
		return errEmptyField
	}
	en.lock()
	_, err := en.e.RemoveFilteredGroupingPolicy(0, sub, "", dom)
	for _, r := range roles {
		if err == nil {
			_, err = en.e.AddGroupingPolicy(sub, r, dom)
		}
	}
	en.mu.Unlock()
	if err != nil {
		return fmt.Errorf("set roles: %w", err)
	}
	return en.changed(ctx, true)
}

// RolesIn lists the roles sub holds in dom.
func (en *Enforcer) RolesIn(sub, dom string) ([]string, error) {
	as, err := en.Assignments(sub, dom)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range as {
		out = append(out, a.Role)
	}
	return out, nil
}

// removeExisting removes one exact grouping (or policy) line, and only if
// the enforcer holds it. The gorm adapter deletes with a filter that skips
// empty fields and runs before the model is consulted, so without these
// checks a request with empty fields answered "not found" after deleting
// every rule of the table from the database. en.mu must be held.
func (en *Enforcer) removeExisting(grouping bool, rule ...string) (bool, error) {
	for _, f := range rule {
		if f == "" {
			return false, nil
		}
	}
	has, remove := en.e.HasPolicy, en.e.RemovePolicy
	if grouping {
		has, remove = en.e.HasGroupingPolicy, en.e.RemoveGroupingPolicy
	}
	ok, err := has(toIface(rule)...)
	if err != nil || !ok {
		return false, err
	}
	return remove(toIface(rule)...)
}

// RemoveSubject drops every assignment and rule of sub (user or key gone).
func (en *Enforcer) RemoveSubject(ctx context.Context, sub string) error {
	if sub == "" {
		return errEmptyField
	}
	en.lock()
	ok1, err := en.e.RemoveFilteredGroupingPolicy(0, sub)
	if err == nil {
		var ok2 bool
		ok2, err = en.e.RemoveFilteredPolicy(0, sub)
		ok1 = ok1 || ok2
	}
	en.mu.Unlock()
	if err != nil {
		return fmt.Errorf("remove subject: %w", err)
	}
	return en.changed(ctx, ok1)
}

// RemoveDomain drops every assignment in dom (department deleted).
func (en *Enforcer) RemoveDomain(ctx context.Context, dom string) error {
	if dom == "" {
		return errEmptyField
	}
	en.lock()
	ok, err := en.e.RemoveFilteredGroupingPolicy(2, dom)
	en.mu.Unlock()
	if err != nil {
		return fmt.Errorf("remove domain: %w", err)
	}
	return en.changed(ctx, ok)
}

// Rule is an explicit policy line (allow or deny) on a subject or role.
type Rule struct {
	Subject string `json:"subject"`
	Domain  string `json:"domain"`
	Object  string `json:"object"`
	Action  string `json:"action"`
	Effect  string `json:"effect"`
}

// AddRule adds an explicit rule, e.g. a deny that overrides a role's allow
// for one user. Rules on built-in subjects are refused with ErrBuiltin.
func (en *Enforcer) AddRule(ctx context.Context, r Rule) (bool, error) {
	if BuiltinSubject(r.Subject) {
		return false, ErrBuiltin
	}
	en.lock()
	ok, err := en.e.AddPolicy(r.Subject, r.Domain, r.Object, r.Action, r.Effect)
	en.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("add rule: %w", err)
	}
	return ok, en.changed(ctx, ok)
}

// RemoveRule removes an explicit rule. One that does not exist changes
// nothing and reports false.
func (en *Enforcer) RemoveRule(ctx context.Context, r Rule) (bool, error) {
	if isBuiltin(builtinPolicies, r.Subject, r.Domain, r.Object, r.Action, r.Effect) {
		return false, ErrBuiltin
	}
	en.lock()
	ok, err := en.removeExisting(false, r.Subject, r.Domain, r.Object, r.Action, r.Effect)
	en.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("remove rule: %w", err)
	}
	return ok, en.changed(ctx, ok)
}

// Rules lists explicit rules that are not built in.
func (en *Enforcer) Rules() ([]Rule, error) {
	en.mu.RLock()
	defer en.mu.RUnlock()
	builtin := map[string]bool{}
	for _, p := range builtinPolicies {
		builtin[strings.Join(p, "\x00")] = true
	}
	all, err := en.e.GetPolicy()
	if err != nil {
		return nil, fmt.Errorf("read policies: %w", err)
	}
	var out []Rule
	for _, p := range all {
		if len(p) < 5 || builtin[strings.Join(p, "\x00")] {
			continue
		}
		out = append(out, Rule{Subject: p[0], Domain: p[1], Object: p[2], Action: p[3], Effect: p[4]})
	}
	return out, nil
}

// changed publishes a local change to other replicas. The version the
// bump returns is taken for what is loaded here only when it is the
// loaded one plus this change: when another replica changed the policies
// since they were loaded here, they are loaded again (this change with
// them), or its change would pass for loaded and never be.
func (en *Enforcer) changed(ctx context.Context, did bool) error {
	if !did {
		return nil
	}
	v, err := en.bump(ctx)
	if err != nil {
		return err
	}
	en.lock()
	defer en.mu.Unlock()
	switch {
	case v == en.version+1:
		en.version = v
	case v > en.version+1:
		if err := en.e.LoadPolicy(); err != nil {
			return fmt.Errorf("reload policy: %w", err)
		}
		en.version = v
	default:
		// A later state is loaded already (a reload that included this
		// change ran first): keep it.
	}
	en.checkedAt = en.now()
	return nil
}

// Roles lists the assignable roles and where they apply.
func Roles() []RoleInfo {
	return []RoleInfo{
		{Name: RoleOrgAdmin, Scope: "org", Description: "Manages everything in the organization."},
		{Name: RoleAuditor, Scope: "org", Description: "Reads the audit log, terminal recordings, and every session, agent and environment (without secrets); changes nothing."},
		{Name: RoleDeptOwner, Scope: "department", Description: "Manages a department's members, agents, environments and templates."},
		{Name: RoleMember, Scope: "department", Description: "Uses the department's agents and environments."},
	}
}

// RoleInfo describes a built-in role.
type RoleInfo struct {
	Name        string `json:"name"`
	Scope       string `json:"scope"`
	Description string `json:"description"`
}

// ValidAssignment explains what is wrong with an assignment, or "".
func ValidAssignment(a Assignment) string {
	switch a.Role {
	case RoleOrgAdmin, RoleAuditor:
		if a.Domain != DomainOrg {
			return fmt.Sprintf("The role %s applies to the whole organization; use domain %q.", a.Role, DomainOrg)
		}
	case RoleDeptOwner, RoleMember:
		if !strings.HasPrefix(a.Domain, "dept:") {
			return fmt.Sprintf("The role %s applies to a department; use domain \"dept:<id>\".", a.Role)
		}
	default:
		return fmt.Sprintf("Unknown role %q; choose org-admin, auditor, dept-owner or member.", a.Role)
	}
	return ""
}
