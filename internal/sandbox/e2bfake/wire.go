package e2bfake

// Wire types, per E2B's OpenAPI document (spec/openapi.yml, e2b-dev/infra).
// Request types use pointers wherever the document makes a field optional
// or typed, so that validation can tell "missing" and "null" from a zero
// value, as E2B's spec validation does.

type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type wireAutoResume struct {
	// Enabled is required by SandboxAutoResumeConfig.
	Enabled *bool `json:"enabled"`
}

type wireNetwork struct {
	AllowPublicTraffic *bool    `json:"allowPublicTraffic"`
	AllowOut           []string `json:"allowOut"`
	DenyOut            []string `json:"denyOut"`
	MaskRequestHost    *string  `json:"maskRequestHost"`
}

type wireLifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

type wireNewSandbox struct {
	TemplateID          *string            `json:"templateID"`
	Timeout             *int32             `json:"timeout"`
	AutoPause           *bool              `json:"autoPause"`
	AutoResume          *wireAutoResume    `json:"autoResume"`
	Secure              *bool              `json:"secure"`
	AllowInternetAccess *bool              `json:"allow_internet_access"`
	Network             *wireNetwork       `json:"network"`
	Metadata            map[string]*string `json:"metadata"`
	EnvVars             map[string]*string `json:"envVars"`
	// Lifecycle is CubeSandbox's; E2B does not know it and ignores it.
	Lifecycle *wireLifecycle `json:"lifecycle"`
}

type wireSandbox struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

type wireListedSandbox struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	StartedAt   string            `json:"startedAt"`
	EndAt       string            `json:"endAt,omitempty"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata,omitempty"`
}

type wireSandboxDetail struct {
	wireListedSandbox
	EnvdAccessToken string        `json:"envdAccessToken,omitempty"`
	Domain          *string       `json:"domain"`
	Lifecycle       wireLifecycle `json:"lifecycle"`
}

// wireTimeout is ConnectSandbox, the timeout body and ResumedSandbox.
type wireTimeout struct {
	Timeout   *int32 `json:"timeout"`
	AutoPause *bool  `json:"autoPause"`
}

type wirePause struct {
	Memory *bool `json:"memory"`
}

type wireTemplate struct {
	TemplateID    string   `json:"templateID"`
	BuildID       string   `json:"buildID"`
	CPUCount      int      `json:"cpuCount"`
	MemoryMB      int      `json:"memoryMB"`
	DiskSizeMB    int      `json:"diskSizeMB"`
	Public        bool     `json:"public"`
	Aliases       []string `json:"aliases"`
	Names         []string `json:"names"`
	CreatedAt     string   `json:"createdAt"`
	UpdatedAt     string   `json:"updatedAt"`
	CreatedBy     *string  `json:"createdBy"`
	LastSpawnedAt *string  `json:"lastSpawnedAt"`
	SpawnCount    int64    `json:"spawnCount"`
	BuildCount    int32    `json:"buildCount"`
	BuildStatus   string   `json:"buildStatus"`
	EnvdVersion   string   `json:"envdVersion"`
}

type wireTemplateBuild struct {
	BuildID     string `json:"buildID"`
	Status      string `json:"status"`
	CreatedAt   string `json:"createdAt"`
	UpdatedAt   string `json:"updatedAt"`
	FinishedAt  string `json:"finishedAt"`
	CPUCount    int    `json:"cpuCount"`
	MemoryMB    int    `json:"memoryMB"`
	DiskSizeMB  int    `json:"diskSizeMB"`
	EnvdVersion string `json:"envdVersion"`
}

// wireTemplateWithBuilds is GET /templates/{id}'s TemplateWithBuilds.
type wireTemplateWithBuilds struct {
	TemplateID    string              `json:"templateID"`
	Public        bool                `json:"public"`
	Aliases       []string            `json:"aliases"`
	Names         []string            `json:"names"`
	CreatedAt     string              `json:"createdAt"`
	UpdatedAt     string              `json:"updatedAt"`
	LastSpawnedAt *string             `json:"lastSpawnedAt"`
	SpawnCount    int64               `json:"spawnCount"`
	Builds        []wireTemplateBuild `json:"builds"`
}
