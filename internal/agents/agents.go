// Package agents holds Agents: what a department runs, with which model
// configuration, in which execution environments, and whether every
// session gets its own sandbox.
package agents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/policy"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Sandbox modes.
const (
	SandboxOff        = "off"
	SandboxPerSession = "per-session"
)

// Defaults.
const (
	DefaultIdleTimeout  = 15 * time.Minute
	DefaultReclaimAfter = 60 * time.Minute
)

// Agent is a configured agent.
type Agent struct {
	ID                   int64 `gorm:"primaryKey"`
	DepartmentID         *int64
	Name                 string
	Description          string
	Config               string
	SandboxMode          string
	TemplateID           *int64
	DefaultEnvironmentID int64
	IdleTimeoutSeconds   int
	ReclaimAfterSeconds  int
	// CommandPolicy is the legacy list of denied command patterns (JSON):
	// the text deny rules of ExecPolicy, kept for clients that read it.
	CommandPolicy string
	// ExecPolicy is the execution policy's canonical JSON, "" for an agent
	// saved before there were execution policies (see Exec).
	ExecPolicy string
	// ExecPolicyDigest is the SHA-256 of ExecPolicy: the policy's version.
	ExecPolicyDigest string
	CreatedBy        string
	CreatedAt        time.Time
	UpdatedAt        time.Time
	// EnvironmentIDs are the allowed environments (agent_environments).
	EnvironmentIDs []int64 `gorm:"-"`
}

// TableName binds Agent to its table.
func (Agent) TableName() string { return "agents" }

// IdleTimeout is how long the agent's sandboxes run without use before the
// backend pauses them (DefaultIdleTimeout when unset).
func (a Agent) IdleTimeout() time.Duration {
	if a.IdleTimeoutSeconds <= 0 {
		return DefaultIdleTimeout
	}
	return time.Duration(a.IdleTimeoutSeconds) * time.Second
}

// ReclaimAfter is how long the agent's sandboxes stay paused before they
// are reclaimed (DefaultReclaimAfter when unset).
func (a Agent) ReclaimAfter() time.Duration {
	if a.ReclaimAfterSeconds <= 0 {
		return DefaultReclaimAfter
	}
	return time.Duration(a.ReclaimAfterSeconds) * time.Second
}

type agentEnv struct {
	AgentID       int64
	EnvironmentID int64
}

func (agentEnv) TableName() string { return "agent_environments" }

// Config is the documented agent configuration (docs/agents.md). Unknown
// fields are refused so a typo does not silently do nothing.
type Config struct {
	Model        string  `json:"model"`
	SystemPrompt string  `json:"system_prompt,omitempty"`
	Skills       []Skill `json:"skills,omitempty"`
}

// Skill is a capability mounted into the agent's workspace. Source is an
// https:// URL (fetched by agentd inside the environment), an absolute
// path already inside the environment (copied into place), or
// "upload:<name>", a bundle uploaded to the agent (see uploads.go).
// SHA256, when set, pins what is placed: the downloaded or uploaded bytes
// (for a path source, nothing is hashed and a pin is refused).
type Skill struct {
	Name      string `json:"name"`
	Source    string `json:"source"`
	MountPath string `json:"mount_path,omitempty"`
	SHA256    string `json:"sha256,omitempty"`
}

// UploadSource is the prefix of a skill source naming an uploaded bundle.
const UploadSource = "upload:"

// Uploaded returns the bundle name of a skill whose source is an upload.
func (s Skill) Uploaded() (string, bool) {
	return strings.CutPrefix(s.Source, UploadSource)
}

var (
	skillNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)
	sha256RE    = regexp.MustCompile(`^[0-9a-f]{64}$`)
	nameRE      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9 _.-]{0,99}$`)
)

// ParseConfig validates raw config JSON and returns it normalized.
func ParseConfig(raw string, v *apperr.ValidationError) (Config, string) {
	var c Config
	if strings.TrimSpace(raw) == "" {
		v.Add("config", "The configuration is required: at least {\"model\": \"...\"}.")
		return c, ""
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		v.Add("config", "%s Allowed fields: model, system_prompt, skills[{name, source, mount_path, sha256}].", apperr.DescribeJSON("The configuration", err))
		return c, ""
	}
	if dec.More() {
		v.Add("config", "The configuration must be a single JSON object.")
		return c, ""
	}
	c.Model = strings.TrimSpace(c.Model)
	if c.Model == "" || len(c.Model) > 200 {
		v.Add("config", "config.model is required (at most 200 characters), e.g. \"claude-sonnet-4\".")
	}
	if len(c.SystemPrompt) > 100_000 {
		v.Add("config", "config.system_prompt must be at most 100,000 characters.")
	}
	if len(c.Skills) > 100 {
		v.Add("config", "At most 100 skills.")
	}
	seen := map[string]bool{}
	for i, s := range c.Skills {
		switch {
		case !skillNameRE.MatchString(s.Name):
			v.Add("config", "config.skills[%d].name must be 1–64 lowercase letters, digits, dots, dashes or underscores.", i)
		case seen[s.Name]:
			v.Add("config", "config.skills[%d].name %q appears twice.", i, s.Name)
		case s.Source == "":
			v.Add("config", "config.skills[%d].source is required (an https:// URL, an absolute path or upload:<name>).", i)
		case strings.HasPrefix(s.Source, UploadSource) && !skillNameRE.MatchString(strings.TrimPrefix(s.Source, UploadSource)):
			v.Add("config", "config.skills[%d].source %q must name an uploaded bundle: upload: followed by 1–64 lowercase letters, digits, dots, dashes or underscores.", i, s.Source)
		case !strings.HasPrefix(s.Source, UploadSource) && !strings.HasPrefix(s.Source, "https://") && !strings.HasPrefix(s.Source, "http://") && !strings.HasPrefix(s.Source, "/"):
			v.Add("config", "config.skills[%d].source must be an http(s) URL, an absolute path or upload:<name>.", i)
		case strings.HasPrefix(s.Source, "/") && strings.Contains(s.Source, ".."):
			v.Add("config", "config.skills[%d].source must be an absolute path without \"..\".", i)
		case s.MountPath != "" && (!strings.HasPrefix(s.MountPath, "/") || strings.Contains(s.MountPath, "..")):
			v.Add("config", "config.skills[%d].mount_path must be an absolute path without \"..\".", i)
		case s.SHA256 != "" && !sha256RE.MatchString(s.SHA256):
			v.Add("config", "config.skills[%d].sha256 must be 64 lowercase hexadecimal digits.", i)
		case s.SHA256 != "" && strings.HasPrefix(s.Source, "/"):
			v.Add("config", "config.skills[%d].sha256 cannot pin a path source (a directory has no single hash); pin a URL or an uploaded bundle.", i)
		}
		seen[s.Name] = true
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(c)
	return c, strings.TrimSpace(buf.String())
}

// ParsePolicy validates the command policy: regular expressions (RE2) that
// deny an exec whose command string matches. Defence in depth, not a
// boundary: an interactive TTY can type anything.
func ParsePolicy(patterns []string, v *apperr.ValidationError) string {
	if len(patterns) > 200 {
		v.Add("command_policy", "At most 200 patterns.")
	}
	clean := []string{}
	for i, p := range patterns {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if len(p) > 500 {
			v.Add("command_policy", "Pattern %d is longer than 500 characters.", i+1)
			continue
		}
		if _, err := regexp.Compile(p); err != nil {
			v.Add("command_policy", "Pattern %d (%q) is not a valid regular expression: %v.", i+1, p, err)
			continue
		}
		clean = append(clean, p)
	}
	b, _ := json.Marshal(clean)
	return string(b)
}

// Exec is the agent's execution policy, normalized. An agent saved before
// execution policies has its command patterns as text deny rules
// (policy.FromPatterns), so it denies exactly what it denied. A stored
// policy that does not decode is an error: the gateway then runs nothing.
func (a Agent) Exec() (policy.Exec, error) {
	if strings.TrimSpace(a.ExecPolicy) == "" {
		return policy.FromPatterns(a.Policy()), nil
	}
	p := policy.DefaultExec()
	if err := json.Unmarshal([]byte(a.ExecPolicy), &p); err != nil {
		return p, fmt.Errorf("agent %d: read its execution policy: %w", a.ID, err)
	}
	p.Normalize()
	return p, nil
}

// ExecVersion names the version of the agent's execution policy: its
// digest, computed for an agent saved before execution policies.
func (a Agent) ExecVersion() string {
	if a.ExecPolicyDigest != "" && a.ExecPolicy != "" {
		return a.ExecPolicyDigest
	}
	p, err := a.Exec()
	if err != nil {
		return ""
	}
	return p.Digest()
}

// TextPatterns are the patterns of p's text deny rules: what the legacy
// command_policy field shows.
func TextPatterns(p policy.Exec) []string {
	out := []string{}
	for _, r := range p.Rules {
		if r.Text != "" && r.Action == policy.Deny {
			out = append(out, r.Text)
		}
	}
	return out
}

// Policy returns the agent's legacy deny patterns (command_policy).
func (a Agent) Policy() []string {
	var ps []string
	_ = json.Unmarshal([]byte(a.CommandPolicy), &ps)
	return ps
}

// DeniedBy returns the first policy pattern command matches, or "".
func (a Agent) DeniedBy(command string) string {
	for _, p := range a.Policy() {
		if re, err := regexp.Compile(p); err == nil && re.MatchString(command) {
			return p
		}
	}
	return ""
}

// Input creates or updates an agent; nil pointers leave fields unchanged on
// update and take defaults on create.
type Input struct {
	DepartmentID         *int64
	Name                 *string
	Description          *string
	Config               *string
	SandboxMode          *string
	TemplateID           *int64
	EnvironmentIDs       []int64
	DefaultEnvironmentID *int64
	IdleTimeout          *time.Duration
	ReclaimAfter         *time.Duration
	// CommandPolicy (legacy) replaces the text deny rules of the execution
	// policy with these patterns; given with ExecPolicy, they are added to
	// its rules unless one already denies that text.
	CommandPolicy []string
	// ExecPolicy is the execution policy as JSON (policy.ParseExec).
	ExecPolicy *string
}

// EnvLookup reads environments and templates for validation, as the
// acting principal may see them.
type EnvLookup interface {
	Get(ctx context.Context, a *authz.Actor, id int64) (envs.Environment, error)
	Usable(ctx context.Context, a *authz.Actor, e envs.Environment) (bool, error)
	GetTemplate(ctx context.Context, a *authz.Actor, id int64) (envs.Template, error)
}

// Service manages one org's agents.
type Service struct {
	DB   *gorm.DB
	Envs EnvLookup
	Now  func() time.Time
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

// validate applies in to a and checks every rule, with a message that says
// which rule failed. Environments and templates are looked up as actor may
// see them; one it may not use reads as missing.
func (s *Service) validate(ctx context.Context, actor *authz.Actor, a *Agent, in Input, creating bool) error {
	v := apperr.Validation()
	if in.DepartmentID != nil {
		a.DepartmentID = in.DepartmentID
		if *in.DepartmentID == 0 {
			a.DepartmentID = nil
		}
		if a.DepartmentID != nil {
			var n int64
			if err := s.DB.WithContext(ctx).Table("departments").Where("id = ?", *a.DepartmentID).Count(&n).Error; err != nil {
				return fmt.Errorf("read department: %w", err)
			}
			if n == 0 {
				v.Add("department_id", "Department %d does not exist.", *a.DepartmentID)
			}
		}
	}
	if in.Name != nil {
		a.Name = strings.TrimSpace(*in.Name)
	}
	if !nameRE.MatchString(a.Name) {
		v.Add("name", "Name must be 1–100 letters, digits, spaces, dots, dashes or underscores, starting with a letter or digit.")
	}
	if in.Description != nil {
		a.Description = strings.TrimSpace(*in.Description)
	}
	if len(a.Description) > 2000 {
		v.Add("description", "Description must be at most 2000 characters.")
	}
	if in.Config != nil || creating {
		_, norm := ParseConfig(deref(in.Config), v)
		a.Config = norm
	}
	if in.SandboxMode != nil {
		a.SandboxMode = *in.SandboxMode
	} else if creating {
		a.SandboxMode = SandboxOff
	}
	if a.SandboxMode != SandboxOff && a.SandboxMode != SandboxPerSession {
		v.Add("sandbox_mode", "Sandbox mode must be \"off\" (sessions run in a host's workspace) or \"per-session\" (every session gets its own sandbox).")
	}
	if in.TemplateID != nil {
		a.TemplateID = in.TemplateID
		if *in.TemplateID == 0 {
			a.TemplateID = nil
		}
	}
	if in.IdleTimeout != nil {
		a.IdleTimeoutSeconds = int(in.IdleTimeout.Seconds())
	} else if creating {
		a.IdleTimeoutSeconds = int(DefaultIdleTimeout.Seconds())
	}
	if in.ReclaimAfter != nil {
		a.ReclaimAfterSeconds = int(in.ReclaimAfter.Seconds())
	} else if creating {
		a.ReclaimAfterSeconds = int(DefaultReclaimAfter.Seconds())
	}
	if a.IdleTimeoutSeconds < 60 || a.IdleTimeoutSeconds > 7*24*3600 {
		v.Add("idle_timeout", "The idle timeout before pause must be from 1 minute to 7 days.")
	}
	if a.ReclaimAfterSeconds < 60 || a.ReclaimAfterSeconds > 90*24*3600 {
		v.Add("reclaim_after", "The reclaim window after pause must be from 1 minute to 90 days.")
	}
	s.validateExec(a, in, creating, v)
	if in.EnvironmentIDs != nil {
		a.EnvironmentIDs = dedupe(in.EnvironmentIDs)
	}
	if in.DefaultEnvironmentID != nil {
		a.DefaultEnvironmentID = *in.DefaultEnvironmentID
	}
	if len(a.EnvironmentIDs) == 0 {
		v.Add("environment_ids", "Choose at least one execution environment the agent may use.")
	}
	if a.DefaultEnvironmentID == 0 && len(a.EnvironmentIDs) == 1 {
		a.DefaultEnvironmentID = a.EnvironmentIDs[0]
	}
	if a.DefaultEnvironmentID != 0 && !contains(a.EnvironmentIDs, a.DefaultEnvironmentID) {
		v.Add("default_environment_id", "The default environment must be one of the allowed environments.")
	} else if a.DefaultEnvironmentID == 0 && len(a.EnvironmentIDs) > 1 {
		v.Add("default_environment_id", "Choose which allowed environment is the default.")
	}
	if err := s.checkEnvironments(ctx, actor, a, v); err != nil {
		return err
	}
	return v.Err()
}

// validateExec applies in's execution policy (and legacy patterns) to a,
// storing it canonical with its digest and its text deny patterns as
// command_policy.
func (s *Service) validateExec(a *Agent, in Input, creating bool, v *apperr.ValidationError) {
	var p policy.Exec
	switch {
	case in.ExecPolicy != nil:
		p = policy.ParseExec(*in.ExecPolicy, v, "exec_policy")
	case creating:
		p = policy.DefaultExec()
	default:
		cur, err := a.Exec()
		if err != nil && in.CommandPolicy == nil {
			v.Add("exec_policy", "The stored execution policy cannot be read; give a new one.")
			return
		}
		p = cur
		if in.CommandPolicy != nil {
			// The patterns replace the text deny rules they stood for.
			p.Rules = slices.DeleteFunc(slices.Clone(p.Rules), func(r policy.ExecRule) bool { return r.Text != "" && r.Action == policy.Deny })
		}
	}
	if in.CommandPolicy != nil {
		var pats []string
		_ = json.Unmarshal([]byte(ParsePolicy(in.CommandPolicy, v)), &pats)
		have := TextPatterns(p)
		for _, r := range policy.FromPatterns(pats).Rules {
			if !slices.Contains(have, r.Text) {
				p.Rules = append(p.Rules, r)
			}
		}
		if len(p.Rules) > policy.MaxExecRules {
			v.Add("exec_policy.rules", "At most %d rules (there are %d with the command patterns).", policy.MaxExecRules, len(p.Rules))
		}
	}
	// What agentd would enforce is not built yet: refuse rather than
	// accept a promise nothing keeps.
	if p.RequireEnforcement {
		v.Add("exec_policy.require_enforcement", "require_enforcement is not available yet: no environment enforces the rules where programs start.")
	}
	if len(p.ExecPaths) > 0 {
		v.Add("exec_policy.exec_paths", "exec_paths are not available yet: they are enforced only where programs start, which no environment does yet.")
	}
	a.ExecPolicy = string(p.Canonical())
	a.ExecPolicyDigest = p.Digest()
	b, _ := json.Marshal(TextPatterns(p))
	a.CommandPolicy = string(b)
}

// checkEnvironments checks a's environments and template as actor may
// see them: each usable and of the agent's department, a sandbox
// environment and a ready template of it when sessions get sandboxes, a
// host as the default when they do not.
func (s *Service) checkEnvironments(ctx context.Context, actor *authz.Actor, a *Agent, v *apperr.ValidationError) error {
	hasSandbox := false
	var sandboxEnvs []int64
	for _, id := range a.EnvironmentIDs {
		e, err := s.Envs.Get(ctx, actor, id)
		if err != nil && !errors.Is(err, apperr.ErrNotFound) {
			return err
		}
		usable := err == nil
		if usable {
			if usable, err = s.Envs.Usable(ctx, actor, e); err != nil {
				return err
			}
		}
		if !usable {
			v.Add("environment_ids", "Environment %d does not exist or you may not use it.", id)
			continue
		}
		if e.DepartmentID != nil && a.DepartmentID != nil && *e.DepartmentID != *a.DepartmentID {
			v.Add("environment_ids", "Environment %q belongs to another department.", e.Name)
		}
		// An org-wide agent is usable by everyone; it may not run on a
		// department's machines.
		if e.DepartmentID != nil && a.DepartmentID == nil {
			v.Add("environment_ids", "Environment %q belongs to a department; an organization-wide agent may use only organization-wide environments.", e.Name)
		}
		if e.Kind == envs.KindSandbox {
			hasSandbox = true
			sandboxEnvs = append(sandboxEnvs, e.ID)
		}
	}
	if a.SandboxMode == SandboxPerSession {
		if !hasSandbox {
			v.Add("sandbox_mode", "Per-session sandboxes need a sandbox environment among the allowed environments.")
		}
		if a.TemplateID == nil {
			v.Add("template_id", "Per-session sandboxes need a template to create them from.")
		} else if t, err := s.Envs.GetTemplate(ctx, actor, *a.TemplateID); err != nil && !errors.Is(err, apperr.ErrNotFound) {
			return err
		} else if err != nil || !contains(sandboxEnvs, t.EnvironmentID) {
			// One message for both: template ids of other departments are
			// not revealed.
			v.Add("template_id", "Template %d is not one of the agent's sandbox environments' templates.", *a.TemplateID)
		} else if !t.Ready() {
			v.Add("template_id", "Template %q is not ready at the backend (status %s).", t.Name, t.BackendStatus)
		}
	} else if a.SandboxMode == SandboxOff {
		a.TemplateID = nil
		if a.DefaultEnvironmentID != 0 {
			if e, err := s.Envs.Get(ctx, actor, a.DefaultEnvironmentID); err == nil && e.Kind != envs.KindHost {
				v.Add("default_environment_id", "With sandbox mode off, sessions run directly on a host: the default environment must be a host.")
			}
		}
	}
	return nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func dedupe(ids []int64) []int64 {
	seen := map[int64]bool{}
	out := []int64{}
	for _, id := range ids {
		if id > 0 && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func contains(xs []int64, x int64) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// create validates and stores an agent with its allowed environments.
func (s *Service) create(ctx context.Context, actor *authz.Actor, in Input) (Agent, error) {
	now := s.now()
	a := Agent{CreatedBy: actor.Name, CreatedAt: now, UpdatedAt: now}
	if err := s.validate(ctx, actor, &a, in, true); err != nil {
		return a, err
	}
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&a).Error; err != nil {
			return err
		}
		return setEnvs(tx, a.ID, a.EnvironmentIDs)
	})
	if err != nil {
		return a, translate(err)
	}
	return a, nil
}

func setEnvs(tx *gorm.DB, id int64, envIDs []int64) error {
	if err := tx.Where("agent_id = ?", id).Delete(&agentEnv{}).Error; err != nil {
		return err
	}
	for _, e := range envIDs {
		if err := tx.Create(&agentEnv{AgentID: id, EnvironmentID: e}).Error; err != nil {
			return err
		}
	}
	return nil
}

func translate(err error) error {
	if store.IsUniqueViolation(err) {
		return &apperr.ValidationError{Fields: map[string]string{"name": "An agent with this name already exists."}}
	}
	return fmt.Errorf("save agent: %w", err)
}

// load reads one agent with its environments, whoever asks.
func (s *Service) load(ctx context.Context, id int64) (Agent, error) {
	a, err := store.ByID[Agent](ctx, s.DB, id, "agent")
	if err != nil {
		return a, err
	}
	if err := s.DB.WithContext(ctx).Model(&agentEnv{}).Where("agent_id = ?", id).Order("environment_id").Pluck("environment_id", &a.EnvironmentIDs).Error; err != nil {
		return a, fmt.Errorf("read agent environments: %w", err)
	}
	return a, nil
}

// listAll returns agents ordered by name; deptIDs, when not nil, limits
// the list to those departments.
func (s *Service) listAll(ctx context.Context, deptIDs []int64) ([]Agent, error) {
	var out []Agent
	q := s.DB.WithContext(ctx).Order("name")
	if deptIDs != nil {
		if len(deptIDs) == 0 {
			return out, nil
		}
		q = q.Where("department_id IN ?", deptIDs)
	}
	if err := q.Find(&out).Error; err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	if len(out) == 0 {
		return out, nil
	}
	ids := make([]int64, len(out))
	for i, a := range out {
		ids[i] = a.ID
	}
	var links []agentEnv
	if err := s.DB.WithContext(ctx).Where("agent_id IN ?", ids).Order("environment_id").Find(&links).Error; err != nil {
		return nil, err
	}
	byAgent := map[int64][]int64{}
	for _, l := range links {
		byAgent[l.AgentID] = append(byAgent[l.AgentID], l.EnvironmentID)
	}
	for i := range out {
		out[i].EnvironmentIDs = byAgent[out[i].ID]
	}
	return out, nil
}

// update validates and stores changes to before, returning after.
func (s *Service) update(ctx context.Context, actor *authz.Actor, before Agent, in Input) (after Agent, err error) {
	id := before.ID
	after = before
	after.EnvironmentIDs = append([]int64(nil), before.EnvironmentIDs...)
	if err = s.validate(ctx, actor, &after, in, false); err != nil {
		return
	}
	after.UpdatedAt = s.now()
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Model(&Agent{}).Where("id = ?", id).Updates(map[string]any{
			"department_id": after.DepartmentID, "name": after.Name, "description": after.Description, "config": after.Config,
			"sandbox_mode": after.SandboxMode, "template_id": after.TemplateID, "default_environment_id": after.DefaultEnvironmentID,
			"idle_timeout_seconds": after.IdleTimeoutSeconds, "reclaim_after_seconds": after.ReclaimAfterSeconds,
			"command_policy": after.CommandPolicy, "exec_policy": after.ExecPolicy, "exec_policy_digest": after.ExecPolicyDigest,
			"updated_at": after.UpdatedAt,
		}).Error; err != nil {
			return err
		}
		return setEnvs(tx, id, after.EnvironmentIDs)
	})
	if err != nil {
		err = translate(err)
	}
	return
}

// remove deletes an agent.
func (s *Service) remove(ctx context.Context, a Agent) (Agent, error) {
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Deleting an agent deletes its sessions, and with them their
		// commands and recordings: evidence an auditor may still need.
		// While any recording is kept (until the org's recording
		// retention removes it) the agent stays. The sessions are locked
		// first, so a command started meanwhile waits on them and then
		// fails rather than vanishing unseen.
		lock := tx.Table("sessions").Where("agent_id = ?", a.ID)
		if store.DialectOfDB(tx) == store.Postgres {
			lock = lock.Clauses(clause.Locking{Strength: "UPDATE"})
		}
		var ids []int64
		if err := lock.Pluck("id", &ids).Error; err != nil {
			return fmt.Errorf("lock the agent's sessions: %w", err)
		}
		if len(ids) > 0 {
			var kept int64
			if err := tx.Table("commands").Where("session_id IN (?) AND recording_removed_at IS NULL",
				tx.Table("sessions").Select("id").Where("agent_id = ?", a.ID)).Count(&kept).Error; err != nil {
				return fmt.Errorf("count the agent's recorded commands: %w", err)
			}
			if kept > 0 {
				return apperr.New(apperr.ErrConflict, "agent_has_recordings",
					"Agent %q cannot be deleted: its sessions hold %d recorded command(s), kept for review until the organization's recording retention removes them.",
					a.Name, kept)
			}
		}
		if err := tx.Delete(&Agent{}, a.ID).Error; err != nil {
			return fmt.Errorf("delete agent: %w", err)
		}
		return nil
	})
	return a, err
}

// Try decides command (with the env variables env) as an exec in one of
// the agent's sessions would be decided by p: which rule decides each
// program the line runs, and why. A line the shell parser rejects is a
// *policy.ParseError (command_unparsable), as at exec.
func Try(p policy.Exec, command string, env map[string]string) (policy.CommandDecision, error) {
	if strings.TrimSpace(command) == "" {
		return policy.CommandDecision{}, &apperr.ValidationError{Fields: map[string]string{"command": "Give a command line to try."}}
	}
	return p.DecideCommand(command, env)
}
