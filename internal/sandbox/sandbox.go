// Package sandbox holds the backend interface Gatehouse uses to manage
// per-session sandboxes, and the domain types and errors shared by every
// backend. The E2B-compatible REST client (which also serves CubeSandbox)
// lives in internal/sandbox/e2b; a fake backend for tests and local
// development lives in internal/sandbox/e2bfake.
package sandbox

import (
	"context"
	"time"
)

// AgentdPort is the port agentd listens on inside every sandbox.
const AgentdPort = 49984

// EnvdPort is the port of the backend's own in-sandbox daemon (envd).
const EnvdPort = 49983

// NoTimeout asks a backend to never time a sandbox out. CubeSandbox accepts
// it (it is sent as -1); E2B rejects it, so use it only against backends that
// document it.
const NoTimeout time.Duration = -1

// State is a sandbox's lifecycle state as reported by the backend.
type State string

// States reported by E2B-compatible backends. StatePausing is CubeSandbox's
// transient state while a snapshot is being taken.
const (
	StateRunning State = "running"
	StatePaused  State = "paused"
	StatePausing State = "pausing"
)

// OnTimeout is what a backend does with a sandbox whose timeout expires.
type OnTimeout string

// Timeout actions.
const (
	OnTimeoutKill  OnTimeout = "kill"
	OnTimeoutPause OnTimeout = "pause"
)

// NewSandbox is a request to create a sandbox.
type NewSandbox struct {
	TemplateID string
	// Timeout is the time to live from creation. Zero leaves it to the
	// backend's default (15 s at E2B, never at CubeSandbox); NoTimeout asks
	// for no timeout. Sub-second parts are rounded up.
	Timeout time.Duration
	// AutoPause pauses the sandbox at timeout instead of killing it, which
	// keeps the workspace for the session's next command.
	AutoPause bool
	// AutoResume lets traffic through the proxy resume a paused sandbox.
	AutoResume bool
	Metadata   map[string]string
	EnvVars    map[string]string
	// AllowPublicTraffic false makes the backend require the traffic access
	// token on proxied requests. Nil leaves the backend default (allowed).
	AllowPublicTraffic *bool
}

// Sandbox is what a backend returns from create and connect: enough to reach
// the sandbox, not its full state.
type Sandbox struct {
	ID                 string
	TemplateID         string
	Alias              string
	ClientID           string
	EnvdVersion        string
	EnvdAccessToken    string
	TrafficAccessToken string
	// Domain is where the sandbox's ports are reachable; empty when the
	// backend did not say, in which case the environment's configured domain
	// applies.
	Domain string
	// Resumed reports that connect thawed a paused sandbox (HTTP 201).
	// CubeSandbox answers 200 even when it resumed, so false is not proof
	// that the sandbox was running.
	Resumed bool
}

// Lifecycle is the sandbox's timeout policy as the backend reports it.
type Lifecycle struct {
	OnTimeout  OnTimeout
	AutoResume bool
}

// Info is a sandbox's state as listed or fetched from the backend. The
// reclaimer judges idleness from these fields, so they are the backend's
// own, never Gatehouse's.
type Info struct {
	ID         string
	TemplateID string
	Alias      string
	ClientID   string
	State      State
	StartedAt  time.Time
	// EndAt is when the current timeout expires; zero when the sandbox never
	// times out (CubeSandbox omits the field then).
	EndAt       time.Time
	CPU         int
	MemoryMB    int
	DiskSizeMB  int
	EnvdVersion string
	Metadata    map[string]string
	// Domain and Lifecycle are only filled by Get (the detail call).
	Domain    string
	Lifecycle *Lifecycle
}

// Template is a sandbox template known to the backend.
type Template struct {
	ID          string
	BuildID     string
	Aliases     []string
	CPU         int
	MemoryMB    int
	DiskSizeMB  int
	Public      bool
	EnvdVersion string
	// BuildStatus is building, waiting, ready or error (E2B's words).
	BuildStatus string
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// ListFilter narrows a sandbox list. All metadata pairs must match.
type ListFilter struct {
	Metadata map[string]string
	// States limits the result to these states; empty means all.
	States []State
	// PageSize is the page size asked of the backend (1..100); zero leaves
	// the backend's default. The client follows every page regardless.
	PageSize int
}

// Backend is the sandbox lifecycle Gatehouse drives. Implementations return
// errors that match ErrNotFound, ErrConflict, ErrUnauthorized,
// ErrRateLimited or ErrUnavailable under errors.Is when the backend said so.
type Backend interface {
	Create(ctx context.Context, req NewSandbox) (Sandbox, error)
	List(ctx context.Context, f ListFilter) ([]Info, error)
	Get(ctx context.Context, id string) (Info, error)
	Kill(ctx context.Context, id string) error
	Pause(ctx context.Context, id string) error
	// Connect resumes a paused sandbox (or confirms a running one) and sets
	// its timeout to now+timeout.
	Connect(ctx context.Context, id string, timeout time.Duration) (Sandbox, error)
	SetTimeout(ctx context.Context, id string, timeout time.Duration) error
	ListTemplates(ctx context.Context) ([]Template, error)
	GetTemplate(ctx context.Context, id string) (Template, error)
	Health(ctx context.Context) error
}
