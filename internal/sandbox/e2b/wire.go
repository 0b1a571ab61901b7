package e2b

import (
	"fmt"
	"time"

	"github.com/gatehouse/gatehouse/internal/sandbox"
)

// Wire types follow E2B's OpenAPI document (spec/openapi.yml in
// e2b-dev/infra) field by field; see docs in shared/e2b-api.md. They stay
// unexported: callers see the sandbox package's domain types.

type autoResumeJSON struct {
	Enabled bool `json:"enabled"`
}

type networkJSON struct {
	AllowPublicTraffic *bool    `json:"allowPublicTraffic,omitempty"`
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
}

type newSandboxJSON struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int32            `json:"timeout,omitempty"`
	AutoPause  bool              `json:"autoPause,omitempty"`
	AutoResume *autoResumeJSON   `json:"autoResume,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"envVars,omitempty"`
	Network    *networkJSON      `json:"network,omitempty"`
	// AllowInternetAccess is read as snake_case by E2B and CubeSandbox
	// alike.
	AllowInternetAccess *bool `json:"allow_internet_access,omitempty"`
	// Secure protects envd with an access token; E2B requires it when
	// public traffic is refused.
	Secure bool `json:"secure"`
	// Lifecycle is CubeSandbox's spelling of the same policy; it takes
	// precedence there, and E2B ignores the unknown field. Sending both keeps
	// one request valid for both servers.
	Lifecycle *lifecycleJSON `json:"lifecycle,omitempty"`
}

type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

type listedSandboxJSON struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       *time.Time        `json:"endAt,omitempty"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	// Detail-only fields.
	Domain    *string        `json:"domain,omitempty"`
	Lifecycle *lifecycleJSON `json:"lifecycle,omitempty"`
}

type timeoutJSON struct {
	Timeout int32 `json:"timeout"`
}

type templateBuildJSON struct {
	BuildID    string    `json:"buildID"`
	Status     string    `json:"status"`
	CPUCount   int       `json:"cpuCount"`
	MemoryMB   int       `json:"memoryMB"`
	DiskSizeMB int       `json:"diskSizeMB"`
	UpdatedAt  time.Time `json:"updatedAt"`
}

type templateJSON struct {
	TemplateID  string    `json:"templateID"`
	BuildID     string    `json:"buildID"`
	CPUCount    int       `json:"cpuCount"`
	MemoryMB    int       `json:"memoryMB"`
	DiskSizeMB  int       `json:"diskSizeMB"`
	Public      bool      `json:"public"`
	Aliases     []string  `json:"aliases"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
	BuildStatus string    `json:"buildStatus"`
	EnvdVersion string    `json:"envdVersion"`
	// Builds is set by GET /templates/{id} on E2B (TemplateWithBuilds),
	// which carries the sizes per build instead of at the top level.
	Builds []templateBuildJSON `json:"builds,omitempty"`
}

type errorJSON struct {
	Code      *int   `json:"code"`
	Message   string `json:"message"`
	ErrorCode string `json:"error_code,omitempty"`
}

// check rejects an answer that lacks the fields every caller relies on.
func (s sandboxJSON) check(op string) error {
	if s.SandboxID == "" {
		return fmt.Errorf("e2b: %s: %w: the answer has no sandboxID", op, sandbox.ErrMalformed)
	}
	return nil
}

func (s sandboxJSON) domain(resumed bool) sandbox.Sandbox {
	out := sandbox.Sandbox{
		ID:              s.SandboxID,
		TemplateID:      s.TemplateID,
		Alias:           s.Alias,
		ClientID:        s.ClientID,
		EnvdVersion:     s.EnvdVersion,
		EnvdAccessToken: s.EnvdAccessToken,
		Resumed:         resumed,
	}
	if s.TrafficAccessToken != nil {
		out.TrafficAccessToken = *s.TrafficAccessToken
	}
	if s.Domain != nil {
		out.Domain = *s.Domain
	}
	return out
}

func (l listedSandboxJSON) domain() sandbox.Info {
	out := sandbox.Info{
		ID:          l.SandboxID,
		TemplateID:  l.TemplateID,
		Alias:       l.Alias,
		ClientID:    l.ClientID,
		State:       sandbox.State(l.State),
		StartedAt:   l.StartedAt,
		CPU:         l.CPUCount,
		MemoryMB:    l.MemoryMB,
		DiskSizeMB:  l.DiskSizeMB,
		EnvdVersion: l.EnvdVersion,
		Metadata:    l.Metadata,
	}
	if l.EndAt != nil {
		out.EndAt = *l.EndAt
	}
	if l.Domain != nil {
		out.Domain = *l.Domain
	}
	if l.Lifecycle != nil {
		out.Lifecycle = &sandbox.Lifecycle{
			OnTimeout:  sandbox.OnTimeout(l.Lifecycle.OnTimeout),
			AutoResume: l.Lifecycle.AutoResume,
		}
	}
	return out
}

func (t templateJSON) domain() sandbox.Template {
	out := sandbox.Template{
		ID:          t.TemplateID,
		BuildID:     t.BuildID,
		Aliases:     t.Aliases,
		CPU:         t.CPUCount,
		MemoryMB:    t.MemoryMB,
		DiskSizeMB:  t.DiskSizeMB,
		Public:      t.Public,
		EnvdVersion: t.EnvdVersion,
		BuildStatus: t.BuildStatus,
		CreatedAt:   t.CreatedAt,
		UpdatedAt:   t.UpdatedAt,
	}
	// TemplateWithBuilds: take sizes and status from the newest ready build.
	if out.CPU == 0 && len(t.Builds) > 0 {
		b := t.Builds[0]
		for _, c := range t.Builds[1:] {
			if c.UpdatedAt.After(b.UpdatedAt) {
				b = c
			}
		}
		out.BuildID, out.CPU, out.MemoryMB, out.DiskSizeMB = b.BuildID, b.CPUCount, b.MemoryMB, b.DiskSizeMB
		if out.BuildStatus == "" {
			out.BuildStatus = b.Status
		}
	}
	return out
}

// seconds converts a duration to the API's int32 seconds, rounding up so a
// sub-second timeout never becomes "expire now". Negative means never (-1).
func seconds(d time.Duration) int32 {
	if d < 0 {
		return -1
	}
	s := (d + time.Second - 1) / time.Second
	if s > 1<<31-1 {
		s = 1<<31 - 1
	}
	return int32(s)
}
