package envs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2b"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Default in-sandbox ports.
const (
	DefaultEnvdPort   = sandbox.EnvdPort
	DefaultAgentdPort = sandbox.AgentdPort
)

// Template is a sandbox template registered for a sandbox environment. A
// sandbox is pre-allocated with exactly these resources, not elastic.
type Template struct {
	ID                int64 `gorm:"primaryKey"`
	EnvironmentID     int64
	BackendTemplateID string
	Name              string
	Image             string
	WritableLayerMB   int `gorm:"column:writable_layer_mb"`
	VCPU              int `gorm:"column:vcpu"`
	MemoryMB          int `gorm:"column:memory_mb"`
	EnvdPort          int
	AgentdPort        int
	ProbePort         int
	BackendStatus     string
	CreatedAt         time.Time
	UpdatedAt         time.Time
}

// TableName binds Template to its table.
func (Template) TableName() string { return "templates" }

// Ready reports whether sessions may be created from the template.
func (t Template) Ready() bool { return t.BackendStatus == "ready" }

// TemplateInput registers a template by hand or completes an import.
type TemplateInput struct {
	BackendTemplateID string
	Name              string
	Image             string
	WritableLayerMB   int
	VCPU              int
	MemoryMB          int
	EnvdPort          int
	AgentdPort        int
	ProbePort         int
	BackendStatus     string
}

func validPort(p int) bool { return p >= 1 && p <= 65535 }

func (in *TemplateInput) validate() error {
	v := apperr.Validation()
	in.BackendTemplateID = strings.TrimSpace(in.BackendTemplateID)
	in.Name = strings.TrimSpace(in.Name)
	if in.BackendTemplateID == "" || len(in.BackendTemplateID) > 200 {
		v.Add("backend_template_id", "The backend template id is required (at most 200 characters).")
	}
	if in.Name == "" {
		in.Name = in.BackendTemplateID
	}
	if in.VCPU < 1 || in.VCPU > 256 {
		v.Add("vcpu", "vCPU must be a whole number from 1 to 256.")
	}
	if in.MemoryMB < 128 || in.MemoryMB > 1<<20 {
		v.Add("memory_mb", "Memory must be from 128 MiB to 1 TiB (in MiB).")
	}
	if in.WritableLayerMB < 0 {
		v.Add("writable_layer_mb", "The writable layer size cannot be negative.")
	}
	if in.EnvdPort == 0 {
		in.EnvdPort = DefaultEnvdPort
	}
	if in.AgentdPort == 0 {
		in.AgentdPort = DefaultAgentdPort
	}
	if !validPort(in.EnvdPort) {
		v.Add("envd_port", "The envd port must be from 1 to 65535.")
	}
	if !validPort(in.AgentdPort) {
		v.Add("agentd_port", "The agentd port must be from 1 to 65535.")
	}
	if in.ProbePort != 0 && !validPort(in.ProbePort) {
		v.Add("probe_port", "The probe port must be from 1 to 65535, or 0 for none.")
	}
	if in.BackendStatus == "" {
		in.BackendStatus = "unknown"
	}
	return v.Err()
}

// addTemplate registers a template for sandbox environment e.
func (s *Service) addTemplate(ctx context.Context, e Environment, in TemplateInput) (Template, error) {
	envID := e.ID
	if e.Kind != KindSandbox {
		return Template{}, &apperr.ValidationError{Fields: map[string]string{"environment_id": "Templates belong to sandbox environments; this one is a host."}}
	}
	if err := in.validate(); err != nil {
		return Template{}, err
	}
	now := s.now()
	t := Template{EnvironmentID: envID, BackendTemplateID: in.BackendTemplateID, Name: in.Name, Image: in.Image,
		WritableLayerMB: in.WritableLayerMB, VCPU: in.VCPU, MemoryMB: in.MemoryMB, EnvdPort: in.EnvdPort, AgentdPort: in.AgentdPort,
		ProbePort: in.ProbePort, BackendStatus: in.BackendStatus, CreatedAt: now, UpdatedAt: now}
	if err := s.DB.WithContext(ctx).Create(&t).Error; err != nil {
		if store.IsUniqueViolation(err) {
			return t, &apperr.ValidationError{Fields: map[string]string{"backend_template_id": "This template is already registered for the environment."}}
		}
		return t, fmt.Errorf("add template: %w", err)
	}
	return t, nil
}

// importInput reads a template's resources from e's backend.
func (s *Service) importInput(ctx context.Context, e Environment, backendID string) (TemplateInput, error) {
	if e.Kind != KindSandbox {
		return TemplateInput{}, &apperr.ValidationError{Fields: map[string]string{"environment_id": "Templates belong to sandbox environments; this one is a host."}}
	}
	b, err := s.Backend(e)
	if err != nil {
		return TemplateInput{}, err
	}
	return importFrom(ctx, b, backendID)
}

// ImportInputFor reads template backendID from the sandbox backend that
// in describes (its URL and API key), before any environment is stored:
// the local sandbox backend is registered with its template in one
// transaction, with no network call inside it. It reaches the backend as
// a shared environment's calls do.
func (s *Service) ImportInputFor(ctx context.Context, in Input, backendID string) (TemplateInput, error) {
	e := Environment{Kind: KindSandbox, URL: deref(in.URL)}
	b, err := e2b.New(e.URL, deref(in.APIKey), s.clientFor(e))
	if err != nil {
		return TemplateInput{}, &apperr.ValidationError{Fields: map[string]string{"url": err.Error()}}
	}
	return importFrom(ctx, b, backendID)
}

func importFrom(ctx context.Context, b sandbox.Backend, backendID string) (TemplateInput, error) {
	bt, err := b.GetTemplate(ctx, backendID)
	if errors.Is(err, sandbox.ErrNotFound) {
		return TemplateInput{}, &apperr.ValidationError{Fields: map[string]string{"backend_template_id": fmt.Sprintf("The backend has no template %q.", backendID)}}
	}
	if err != nil {
		return TemplateInput{}, backendError("read the template from the backend", err)
	}
	name := backendID
	if len(bt.Aliases) > 0 {
		name = bt.Aliases[0]
	}
	return TemplateInput{BackendTemplateID: bt.ID, Name: name, VCPU: bt.CPU, MemoryMB: bt.MemoryMB,
		WritableLayerMB: bt.DiskSizeMB, BackendStatus: normalizeStatus(bt.BuildStatus)}, nil
}

// backendError turns a backend failure into a 502-class message that says
// what was attempted, without the backend's credentials.
func backendError(what string, err error) error {
	return apperr.New(apperr.ErrUnavailable, "backend_error", "Could not %s: %v", what, err)
}

// normalizeStatus maps E2B's buildStatus and CubeSandbox's status to one
// vocabulary: ready, building, error, unknown.
func normalizeStatus(s string) string {
	switch strings.ToLower(s) {
	case "ready":
		return "ready"
	case "building", "waiting", "pending", "running":
		return "building"
	case "error", "failed":
		return "error"
	}
	return "unknown"
}

// templatesOf lists an environment's templates (all when envID is 0).
func (s *Service) templatesOf(ctx context.Context, envID int64) ([]Template, error) {
	var out []Template
	q := s.DB.WithContext(ctx).Order("name")
	if envID != 0 {
		q = q.Where("environment_id = ?", envID)
	}
	if err := q.Find(&out).Error; err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	return out, nil
}

// loadTemplate reads one template, whoever asks.
func (s *Service) loadTemplate(ctx context.Context, id int64) (Template, error) {
	return store.ByID[Template](ctx, s.DB, id, "template")
}

// removeTemplate deletes t unless an agent uses it.
func (s *Service) removeTemplate(ctx context.Context, t Template) (Template, error) {
	id := t.ID
	var n int64
	if err := s.DB.WithContext(ctx).Table("agents").Where("template_id = ?", id).Count(&n).Error; err != nil {
		return t, err
	}
	if n > 0 {
		return t, apperr.New(apperr.ErrConflict, "template_in_use", "Template %q is used by %d agent(s).", t.Name, n)
	}
	if err := s.DB.WithContext(ctx).Delete(&Template{}, id).Error; err != nil {
		return t, fmt.Errorf("delete template: %w", err)
	}
	return t, nil
}

// syncTemplateStatus updates registered templates from the backend's list
// and reports the registered ones the backend no longer has.
func (s *Service) syncTemplateStatus(ctx context.Context, envID int64, backend []sandbox.Template) ([]string, error) {
	regs, err := s.templatesOf(ctx, envID)
	if err != nil {
		return nil, err
	}
	byID := map[string]sandbox.Template{}
	for _, bt := range backend {
		byID[bt.ID] = bt
		for _, a := range bt.Aliases {
			byID[a] = bt
		}
	}
	var missing []string
	for _, t := range regs {
		status := "missing"
		if bt, ok := byID[t.BackendTemplateID]; ok {
			status = normalizeStatus(bt.BuildStatus)
		} else {
			missing = append(missing, t.BackendTemplateID)
		}
		if status != t.BackendStatus {
			if err := s.DB.WithContext(ctx).Model(&Template{}).Where("id = ?", t.ID).
				Updates(map[string]any{"backend_status": status, "updated_at": s.now()}).Error; err != nil {
				return nil, err
			}
		}
	}
	return missing, nil
}
