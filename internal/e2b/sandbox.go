package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/sessions"
)

// Sandbox links a session created through the E2B API to the id the SDK
// knows it by and the key that created it.
type Sandbox struct {
	ID         int64 `gorm:"primaryKey"`
	SessionID  int64
	SandboxID  string
	KeyID      int64
	AgentID    int64
	TemplateID string
	// Metadata is the SDK's metadata map as JSON, answered back in lists.
	Metadata string
	// TokenSealed is the envd access token, sealed for this org and
	// sandbox id (connect answers it again, so it cannot be only hashed).
	TokenSealed    string
	TimeoutSeconds int
	EndAt          *time.Time
	CreatedAt      time.Time
}

// TableName binds Sandbox to its table.
func (Sandbox) TableName() string { return "e2b_sandboxes" }

// MetadataMap decodes the stored metadata.
func (x Sandbox) MetadataMap() map[string]string {
	m := map[string]string{}
	_ = json.Unmarshal([]byte(x.Metadata), &m)
	return m
}

// idSuffixLen is the random part of a sandbox id in hex digits: with the
// longest org slug (40) and envd's port prefix ("49983-") the host label
// 49983-<slug>-<suffix> is 63 characters, DNS's limit.
const idSuffixLen = 16

var idRE = regexp.MustCompile(`^([a-z0-9](?:[a-z0-9-]*[a-z0-9])?)-([0-9a-f]{16})$`)

// NewSandboxID mints a sandbox id for org slug: <slug>-<16 hex digits>.
// The data plane serves every org on one listener, so the id names its org
// (everything else about the sandbox is in that org's database).
func NewSandboxID(slug string) string { return slug + "-" + auth.RandomHex(idSuffixLen/2) }

// OrgOf returns the org slug a sandbox id names; ok is false for anything
// not shaped like one.
func OrgOf(sandboxID string) (slug string, ok bool) {
	m := idRE.FindStringSubmatch(sandboxID)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// EnvdVersion is the envd version the control plane answers
// (envdVersion): the SDKs choose their data-plane requests by it, so it is
// the version of envd's API the data plane serves. 0.5.7: the JS SDK
// (2.51) then calls CloseStdin (from 0.5.2) and may upload octet-stream
// and gzip bodies (from 0.5.7), both served; the next gate, file metadata
// (0.6.2), is not.
const EnvdVersion = "0.5.7"

// PlaceholderDomain is the domain answered when no --e2b-domain is
// configured: .invalid never resolves, so a runtime that forgot
// E2B_SANDBOX_URL fails instead of reaching a real E2B host.
const PlaceholderDomain = "e2b-sandbox-url-required.invalid"

// AnswerDomain is the domain answers carry for a configured domain.
func AnswerDomain(configured string) string {
	if configured == "" {
		return PlaceholderDomain
	}
	return configured
}

// Endpoint is what a runtime sets to use an org's E2B-compatible API.
type Endpoint struct {
	// APIURL is the control plane (E2B_API_URL).
	APIURL string `json:"api_url"`
	// SandboxURL is the data plane as one host (E2B_SANDBOX_URL).
	SandboxURL string `json:"sandbox_url"`
	// Domain is the wildcard domain (E2B_DOMAIN), "" when none.
	Domain string `json:"domain"`
}

// EndpointFor is org slug's endpoint, from the console's public URL, the
// data plane's public URL and its domain.
func EndpointFor(consoleURL, sandboxURL, domain, slug string) Endpoint {
	consoleURL = strings.TrimSuffix(consoleURL, "/")
	if sandboxURL == "" {
		sandboxURL = consoleURL
	}
	return Endpoint{APIURL: consoleURL + "/e2b/orgs/" + slug, SandboxURL: strings.TrimSuffix(sandboxURL, "/"), Domain: domain}
}

// MintAccessToken returns a new envd access token: 32 random bytes, hex.
func MintAccessToken() string { return auth.RandomHex(32) }

// tokenAD binds a sealed token to its org and sandbox: copied to another
// row or database, it does not open.
func tokenAD(slug, sandboxID string) string {
	return sealed.AD(slug, "e2b_sandbox/"+sandboxID+"/envd_access_token")
}

// SealToken seals a sandbox's envd access token for storage.
func SealToken(box *sealed.Box, slug, sandboxID, token string) (string, error) {
	s, err := box.Seal([]byte(token), tokenAD(slug, sandboxID))
	if err != nil {
		return "", fmt.Errorf("seal envd access token: %w", err)
	}
	return s, nil
}

// OpenToken opens a sandbox's sealed envd access token.
func OpenToken(box *sealed.Box, slug string, x Sandbox) (string, error) {
	b, err := box.Open(x.TokenSealed, tokenAD(slug, x.SandboxID))
	if err != nil {
		return "", fmt.Errorf("open envd access token of %s: %w", x.SandboxID, err)
	}
	return string(b), nil
}

// KeyPrincipal is the principal an e2b key acts as: its owner, through the
// key (audit actor api_key:<id>), like any personal API key.
func KeyPrincipal(k directory.APIKey, owner *directory.User) authz.Principal {
	p := authz.Principal{Kind: audit.ActorAPIKey, ID: fmt.Sprint(k.ID), Name: k.Name + " (" + k.Label() + ")", Subject: k.Subject(), KeyID: k.ID}
	if owner != nil {
		p.Name = k.Name + " (" + k.Label() + ", key of " + owner.Email + ")"
		p.UserID = owner.ID
	}
	return p
}

// Insert stores a sandbox's link (in the transaction that creates its
// session, so neither exists without the other).
func Insert(ctx context.Context, db *gorm.DB, x *Sandbox) error {
	if err := db.WithContext(ctx).Create(x).Error; err != nil {
		return fmt.Errorf("save e2b sandbox: %w", err)
	}
	return nil
}

// Find reads a sandbox by the id the SDK knows; apperr.ErrNotFound when
// there is none in this org.
func Find(ctx context.Context, db *gorm.DB, sandboxID string) (Sandbox, error) {
	var out []Sandbox
	if err := db.WithContext(ctx).Where("sandbox_id = ?", sandboxID).Limit(1).Find(&out).Error; err != nil {
		return Sandbox{}, fmt.Errorf("read e2b sandbox: %w", err)
	}
	if len(out) == 0 {
		return Sandbox{}, NotFound(sandboxID)
	}
	return out[0], nil
}

// NotFound is the answer for a sandbox the caller may not see or that
// does not exist: the same, so existence does not leak.
func NotFound(sandboxID string) error {
	return apperr.New(apperr.ErrNotFound, "sandbox_not_found", "Sandbox %q was not found.", sandboxID)
}

// The states E2B lists a sandbox in.
const (
	StateRunning = "running"
	StatePaused  = "paused"
)

// StateOf is the E2B state of a live session: paused, or running for
// every other live state (a pending session is started by create).
func StateOf(sess sessions.Session) string {
	if sess.State == sessions.StatePaused {
		return StatePaused
	}
	return StateRunning
}

// MaxListLimit is the largest page E2B's list answers (and the default).
const MaxListLimit = 100

// ListQuery selects one page of the sandboxes a key created.
type ListQuery struct {
	KeyID, AgentID int64
	// States holds StateRunning and/or StatePaused; empty means both.
	States []string
	// Metadata must all be present, with these values, in a sandbox's.
	Metadata map[string]string
	// Limit is the page size, 1 to MaxListLimit (0: MaxListLimit).
	Limit int
	// NextToken is the previous page's NextToken ("" for the first page).
	NextToken string
}

// Entry is a listed sandbox with its session.
type Entry struct {
	Sandbox Sandbox
	Session sessions.Session
}

// Page is one page of a key's sandboxes, newest first; NextToken is ""
// on the last page.
type Page struct {
	Items     []Entry
	NextToken string
}

// parseNextToken reads a page cursor: the row id of the last sandbox a
// previous page answered (sandboxes after it have smaller ids).
func parseNextToken(tok string) (int64, error) {
	if tok == "" {
		return 0, nil
	}
	id, err := strconv.ParseInt(tok, 10, 64)
	if err != nil || id <= 0 {
		return 0, &apperr.ValidationError{Fields: map[string]string{"nextToken": "nextToken must be the x-next-token header of an earlier list answer; list again without it to start over."}}
	}
	return id, nil
}

// listPasses bounds the batches of rows one list answer reads.
const listPasses = 10

// List answers one page of the live sandboxes key q.KeyID created for its
// agent whose sessions a (the key's actor) may still see, newest first,
// filtered by state and metadata. It walks the key's e2b_sandboxes rows
// with a keyset cursor (never a window of the agent's sessions, which
// other keys and the console also fill) and loads exactly the sessions
// those rows name, so every sandbox is reachable and none repeats across
// pages.
func List(ctx context.Context, db *gorm.DB, svc *sessions.Service, a *authz.Actor, q ListQuery) (Page, error) {
	cursor, err := parseNextToken(q.NextToken)
	if err != nil {
		return Page{}, err
	}
	limit := q.Limit
	if limit <= 0 || limit > MaxListLimit {
		limit = MaxListLimit
	}
	want := map[string]bool{}
	for _, st := range q.States {
		want[st] = true
	}
	if len(want) == 0 {
		want = map[string]bool{StateRunning: true, StatePaused: true}
	}
	// The state is also filtered in the query, so rows of the other state
	// are not read page after page; it is checked again on the session
	// read afterwards, which is what the answer reports.
	excluded := []string{sessions.StateClosed, sessions.StateLost}
	if !want[StatePaused] {
		excluded = append(excluded, sessions.StatePaused)
	}
	var out []Entry
	// One more than the page is looked for, so the last page says so
	// (no token) instead of leading to an empty one. Rows are read a full
	// page at a time whatever the limit (limit=1 with a metadata filter
	// matching nothing must not cost a query per sandbox), and at most
	// listPasses batches per answer: past that the page is answered short,
	// with a token that continues after the last row read.
	scannedTo := int64(0)
	for pass := 0; len(out) <= limit; pass++ {
		if pass == listPasses {
			scannedTo = cursor
			break
		}
		var rows []Sandbox
		qq := db.WithContext(ctx).Table("e2b_sandboxes").Select("e2b_sandboxes.*").
			Joins("JOIN sessions ON sessions.id = e2b_sandboxes.session_id").
			Where("e2b_sandboxes.key_id = ? AND e2b_sandboxes.agent_id = ? AND sessions.state NOT IN ?", q.KeyID, q.AgentID, excluded)
		if !want[StateRunning] {
			qq = qq.Where("sessions.state = ?", sessions.StatePaused)
		}
		if cursor > 0 {
			qq = qq.Where("e2b_sandboxes.id < ?", cursor)
		}
		batch := MaxListLimit + 1
		if err := qq.Order("e2b_sandboxes.id DESC").Limit(batch).Find(&rows).Error; err != nil {
			return Page{}, fmt.Errorf("list e2b sandboxes: %w", err)
		}
		if len(rows) == 0 {
			break
		}
		cursor = rows[len(rows)-1].ID
		ids := make([]int64, 0, len(rows))
		for _, x := range rows {
			ids = append(ids, x.SessionID)
		}
		seen, err := svc.List(ctx, a, sessions.ListFilter{IDs: ids, Limit: len(ids)})
		if err != nil {
			return Page{}, fmt.Errorf("read sessions of e2b sandboxes: %w", err)
		}
		visible := make(map[int64]sessions.Session, len(seen.Items))
		for _, sess := range seen.Items {
			visible[sess.ID] = sess
		}
		for _, x := range rows {
			sess, ok := visible[x.SessionID]
			if !ok || sess.Final() || !want[StateOf(sess)] || !metadataMatches(x.MetadataMap(), q.Metadata) {
				continue
			}
			out = append(out, Entry{Sandbox: x, Session: sess})
			if len(out) > limit {
				break
			}
		}
		if len(rows) < batch {
			break
		}
	}
	p := Page{Items: out}
	switch {
	case len(out) > limit:
		p.Items = out[:limit]
		p.NextToken = strconv.FormatInt(out[limit-1].Sandbox.ID, 10)
	case scannedTo > 0:
		p.NextToken = strconv.FormatInt(scannedTo, 10)
	}
	return p, nil
}

func metadataMatches(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// SetTimeout records a new timeout from now.
func SetTimeout(ctx context.Context, db *gorm.DB, id int64, seconds int, endAt time.Time) error {
	err := db.WithContext(ctx).Model(&Sandbox{}).Where("id = ?", id).
		Updates(map[string]any{"timeout_seconds": seconds, "end_at": endAt.UTC()}).Error
	if err != nil {
		return fmt.Errorf("set e2b sandbox timeout: %w", err)
	}
	return nil
}
