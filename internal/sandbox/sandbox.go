// Package sandbox holds the backend interface Gatehouse uses to manage
// per-session sandboxes, and the domain types and errors shared by every
// backend. The E2B-compatible REST client (which also serves CubeSandbox)
// lives in internal/sandbox/e2b; a fake backend for tests and local
// development lives in internal/sandbox/e2bfake.
package sandbox

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// AgentdPort is the port agentd listens on inside every sandbox.
const AgentdPort = 49984

// EnvdPort is the port of the backend's own in-sandbox daemon (envd).
const EnvdPort = 49983

// NoTimeout asks a backend to never time a sandbox out. CubeSandbox accepts
// it (it is sent as -1); E2B refuses it, so use it only against backends
// that document it.
const NoTimeout time.Duration = -1

// NoTimeoutSeconds is NoTimeout for CreateRequest.TimeoutSeconds.
const NoTimeoutSeconds = -1

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

// CreateRequest is a request to create a sandbox.
type CreateRequest struct {
	TemplateID string
	// TimeoutSeconds is the time to live from creation. Zero leaves it to
	// the backend's default (15 s at E2B, never at CubeSandbox);
	// NoTimeoutSeconds asks for none (CubeSandbox only). E2B refuses 0 and
	// negative values, so the client never sends them except -1.
	TimeoutSeconds int
	// AutoPause pauses the sandbox at timeout instead of killing it, which
	// keeps the workspace for the session's next command.
	AutoPause bool
	// AutoResume lets traffic through the proxy resume a paused sandbox.
	AutoResume bool
	Metadata   map[string]string
	EnvVars    map[string]string
	// Secure asks the backend to protect its in-sandbox daemon (envd) with
	// an access token; only then does the answer carry EnvdAccessToken.
	Secure bool
	// AllowPublicTraffic false makes the backend require the traffic access
	// token on proxied requests. E2B accepts that only for secure
	// sandboxes, so the client also sends secure:true then. Nil leaves the
	// backend default (allowed).
	AllowPublicTraffic *bool
	// Egress is what the backend itself is asked to enforce of the
	// sandbox's outgoing traffic; nil leaves its default (open).
	Egress *Egress
}

// Egress is the part of an egress policy a backend can enforce: hosts
// (names, addresses or CIDRs) allowed and denied for outgoing traffic,
// and whether it may reach the internet at all. Ports, methods and asking
// a person are not expressible here: the sandbox's agentd enforces those.
type Egress struct {
	AllowInternetAccess bool
	AllowOut            []string
	DenyOut             []string
}

// Sandbox is what a backend returns from create and connect: enough to reach
// the sandbox, not its full state.
type Sandbox struct {
	ID          string
	TemplateID  string
	Alias       string
	ClientID    string
	EnvdVersion string
	// EnvdAccessToken is set only for secure sandboxes.
	EnvdAccessToken string
	// TrafficAccessToken is set when public traffic is not allowed; send it
	// as the e2b-traffic-access-token header through the proxy.
	TrafficAccessToken string
	// Domain is where the sandbox's ports are reachable; empty when the
	// backend did not say, in which case the environment's configured
	// domain applies.
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
	// EndAt is when the current timeout expires for a running sandbox. For
	// a paused one E2B reports when it was paused (its snapshot's time), so
	// "paused for" is now minus EndAt. Zero when the sandbox never times out
	// (CubeSandbox omits the field then).
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
	// Template limits the result to one template (E2B's template filter);
	// empty means all.
	Template string
	// StartedAfter limits the result to sandboxes started after it; zero
	// means no limit.
	StartedAfter time.Time
	// PageSize is the page size asked of the backend (1..100); zero leaves
	// the backend's default. The client follows every page regardless.
	PageSize int
}

// Backend is the sandbox lifecycle Gatehouse drives. Errors match the
// sentinels in errors.go under errors.Is (ErrNotFound, ErrConflict,
// ErrAlreadyPaused, ErrUnauthorized, ErrRateLimited, ErrUnavailable,
// ErrServer, ErrTimeout, ErrMalformed, ErrRedirect, ErrBadRequest);
// OutcomeUnknown tells whether a failed mutation may still have happened.
type Backend interface {
	Create(ctx context.Context, req CreateRequest) (Sandbox, error)
	// List returns every matching sandbox, following the backend's pages.
	List(ctx context.Context, f ListFilter) ([]Info, error)
	Get(ctx context.Context, id string) (Info, error)
	// Kill destroys a sandbox; ErrNotFound when it does not exist (any
	// more).
	Kill(ctx context.Context, id string) error
	// Pause snapshots a running sandbox; ErrAlreadyPaused (which also
	// matches ErrConflict) when it is paused already.
	Pause(ctx context.Context, id string) error
	// Connect resumes a paused sandbox (or confirms a running one) and
	// makes it expire timeout from now; E2B only ever extends a running
	// sandbox's timeout here.
	Connect(ctx context.Context, id string, timeout time.Duration) (Sandbox, error)
	// SetTimeout makes the sandbox expire timeout from now (it may shorten
	// it).
	SetTimeout(ctx context.Context, id string, timeout time.Duration) error
	ListTemplates(ctx context.Context) ([]Template, error)
	GetTemplate(ctx context.Context, id string) (Template, error)
	// Health proves the backend answers and accepts the API key.
	Health(ctx context.Context) error
}

// Addressing says how the ports inside an environment's sandboxes are
// reached: host-based, <scheme>://<port>-<id>.<domain>, or path-based
// through a proxy, <ProxyBaseURL>/sandbox/<id>/<port>, for deployments
// without wildcard DNS.
type Addressing struct {
	// Scheme is http or https (default https).
	Scheme string
	// Domain applies when the backend did not name one for the sandbox.
	Domain string
	// ProxyBaseURL, when set, selects path-based addressing.
	ProxyBaseURL string
}

// PortURL is the base URL of a port inside a sandbox; domain is the one the
// backend reported (empty falls back to a.Domain).
func (a Addressing) PortURL(sandboxID, domain string, port int) string {
	if a.ProxyBaseURL != "" {
		return strings.TrimRight(a.ProxyBaseURL, "/") + "/sandbox/" + url.PathEscape(sandboxID) + "/" + strconv.Itoa(port)
	}
	if domain == "" {
		domain = a.Domain
	}
	scheme := a.Scheme
	if scheme == "" {
		scheme = "https"
	}
	return scheme + "://" + strconv.Itoa(port) + "-" + sandboxID + "." + domain
}

// AgentdURL is the base URL of agentd inside sb.
func (a Addressing) AgentdURL(sb Sandbox) string { return a.PortURL(sb.ID, sb.Domain, AgentdPort) }

// SafeAddress reports whether a sandbox's id and domain are plain names,
// safe to build an address from: letters, digits, '-' and '.' (domain),
// no scheme, port, path or userinfo a backend could use to point the
// console's agentd calls (and their token) elsewhere.
func SafeAddress(sb Sandbox) bool {
	if !plainName(sb.ID, false) {
		return false
	}
	return sb.Domain == "" || plainName(sb.Domain, true)
}

func plainName(s string, dots bool) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-':
		case r == '.' && dots:
		default:
			return false
		}
	}
	return true
}
