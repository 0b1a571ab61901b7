// Package sso signs org users in through the org's own OpenID Connect
// provider: per-org configuration (client secret sealed), the
// authorization code flow with PKCE, state and nonce, ID token
// verification, identity linking and the group → role mapping.
//
// Nothing here writes roles or audit records: the handlers do, so that
// every change is recorded next to the request that caused it.
package sso

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sealed"
)

// secretField is the sealed field name of the client secret; with the
// org slug it is the associated data, so a sealed secret copied into
// another org's database does not open.
const secretField = "sso/client_secret"

// Mapping gives members of an IdP group a role: org-wide (org-admin,
// auditor) or in a department (dept-owner, member).
type Mapping struct {
	Group        string `json:"group"`
	Role         string `json:"role"`
	DepartmentID int64  `json:"department_id,omitempty"`
}

// Assignment is the role the mapping stands for.
func (m Mapping) Assignment(subject string) rbac.Assignment {
	dom := rbac.DomainOrg
	if m.DepartmentID != 0 {
		dom = rbac.DeptDomain(m.DepartmentID)
	}
	return rbac.Assignment{Subject: subject, Role: m.Role, Domain: dom}
}

// row is the sso_config table (one row, id 1).
type row struct {
	ID                    int64 `gorm:"primaryKey"`
	ProviderName          string
	IssuerURL             string
	ClientID              string
	ClientSecretSealed    string
	Scopes                string
	EmailClaim            string
	GroupsClaim           string
	AllowedDomains        string
	Mappings              string
	Enabled               bool
	PasswordLoginDisabled bool
	LastSuccessAt         *time.Time
	UpdatedAt             time.Time
}

func (row) TableName() string { return "sso_config" }

// Config is an org's provider as the flow uses it. ClientSecret is the
// opened secret: it leaves this process only towards the provider's
// token endpoint.
type Config struct {
	ProviderName          string
	IssuerURL             string
	ClientID              string
	ClientSecret          string
	Scopes                []string
	EmailClaim            string
	GroupsClaim           string
	AllowedDomains        []string
	Mappings              []Mapping
	Enabled               bool
	PasswordLoginDisabled bool
	LastSuccessAt         *time.Time
	UpdatedAt             time.Time
}

// Label is what the sign-in button names.
func (c Config) Label() string {
	if c.ProviderName != "" {
		return c.ProviderName
	}
	if u, err := url.Parse(c.IssuerURL); err == nil && u.Host != "" {
		return u.Host
	}
	return "single sign-on"
}

// View is the configuration as pages and the API show it: the secret
// only as set or not set.
type View struct {
	Configured            bool       `json:"configured"`
	ProviderName          string     `json:"provider_name"`
	IssuerURL             string     `json:"issuer_url"`
	ClientID              string     `json:"client_id"`
	ClientSecretSet       bool       `json:"client_secret_set"`
	Scopes                []string   `json:"scopes"`
	EmailClaim            string     `json:"email_claim"`
	GroupsClaim           string     `json:"groups_claim"`
	AllowedDomains        []string   `json:"allowed_domains"`
	Mappings              []Mapping  `json:"mappings"`
	Enabled               bool       `json:"enabled"`
	PasswordLoginDisabled bool       `json:"password_login_disabled"`
	LastSuccessAt         *time.Time `json:"last_success_at"`
}

// View hides the secret.
func (c Config) View() View {
	v := View{Configured: c.IssuerURL != "", ProviderName: c.ProviderName, IssuerURL: c.IssuerURL, ClientID: c.ClientID,
		ClientSecretSet: c.ClientSecret != "", Scopes: c.Scopes, EmailClaim: c.EmailClaim, GroupsClaim: c.GroupsClaim,
		AllowedDomains: c.AllowedDomains, Mappings: c.Mappings, Enabled: c.Enabled, PasswordLoginDisabled: c.PasswordLoginDisabled,
		LastSuccessAt: c.LastSuccessAt}
	if v.Scopes == nil {
		v.Scopes = []string{}
	}
	if v.AllowedDomains == nil {
		v.AllowedDomains = []string{}
	}
	if v.Mappings == nil {
		v.Mappings = []Mapping{}
	}
	return v
}

// DefaultScopes are asked for when an admin names none.
func DefaultScopes() []string { return []string{"openid", "email", "profile"} }

// Update is an admin's change. A nil ClientSecret (or an empty one) keeps
// the stored secret: it can be replaced, never read back.
type Update struct {
	ProviderName          string    `json:"provider_name"`
	IssuerURL             string    `json:"issuer_url"`
	ClientID              string    `json:"client_id"`
	ClientSecret          *string   `json:"client_secret"`
	Scopes                []string  `json:"scopes"`
	EmailClaim            string    `json:"email_claim"`
	GroupsClaim           string    `json:"groups_claim"`
	AllowedDomains        []string  `json:"allowed_domains"`
	Mappings              []Mapping `json:"mappings"`
	Enabled               bool      `json:"enabled"`
	PasswordLoginDisabled bool      `json:"password_login_disabled"`
}

// Store reads and writes one org's configuration.
type Store struct {
	DB  *gorm.DB
	Box *sealed.Box
	Org string
	Now func() time.Time
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

// Load returns the configuration; ok is false when none was saved.
func (s *Store) Load(ctx context.Context) (Config, bool, error) {
	var r row
	res := s.DB.WithContext(ctx).Where("id = 1").Limit(1).Find(&r)
	if res.Error != nil {
		return Config{}, false, fmt.Errorf("read sso config: %w", res.Error)
	}
	if res.RowsAffected == 0 {
		return Config{EmailClaim: "email", GroupsClaim: "groups", Scopes: DefaultScopes()}, false, nil
	}
	c := Config{ProviderName: r.ProviderName, IssuerURL: r.IssuerURL, ClientID: r.ClientID, Scopes: strings.Fields(r.Scopes),
		EmailClaim: r.EmailClaim, GroupsClaim: r.GroupsClaim, AllowedDomains: strings.Fields(r.AllowedDomains),
		Enabled: r.Enabled, PasswordLoginDisabled: r.PasswordLoginDisabled, LastSuccessAt: r.LastSuccessAt, UpdatedAt: r.UpdatedAt}
	if err := json.Unmarshal([]byte(r.Mappings), &c.Mappings); err != nil {
		return Config{}, false, fmt.Errorf("read sso group mappings: %w", err)
	}
	if r.ClientSecretSealed != "" {
		pt, err := s.Box.Open(r.ClientSecretSealed, sealed.AD(s.Org, secretField))
		if err != nil {
			return Config{}, false, fmt.Errorf("open sso client secret: %w", err)
		}
		c.ClientSecret = string(pt)
	}
	return c, true, nil
}

// DepartmentExists is asked for every department a mapping names.
type DepartmentExists func(ctx context.Context, id int64) (bool, error)

// Save validates u and stores it over the current configuration,
// returning the configuration before and after. Turning password
// sign-in off needs a working provider: enabled, and at least one
// successful SSO sign-in, so an org cannot lock its users out with a
// configuration that never worked.
func (s *Store) Save(ctx context.Context, u Update, deptExists DepartmentExists) (before, after Config, err error) {
	before, _, err = s.Load(ctx)
	if err != nil {
		return
	}
	after, err = s.validate(ctx, before, u, deptExists)
	if err != nil {
		return
	}
	after.UpdatedAt = s.now()
	r := row{ID: 1, ProviderName: after.ProviderName, IssuerURL: after.IssuerURL, ClientID: after.ClientID,
		Scopes: strings.Join(after.Scopes, " "), EmailClaim: after.EmailClaim, GroupsClaim: after.GroupsClaim,
		AllowedDomains: strings.Join(after.AllowedDomains, " "), Enabled: after.Enabled,
		PasswordLoginDisabled: after.PasswordLoginDisabled, LastSuccessAt: after.LastSuccessAt, UpdatedAt: after.UpdatedAt}
	m, err := json.Marshal(after.Mappings)
	if err != nil {
		return before, after, fmt.Errorf("encode group mappings: %w", err)
	}
	r.Mappings = string(m)
	if after.ClientSecret != "" {
		if r.ClientSecretSealed, err = s.Box.Seal([]byte(after.ClientSecret), sealed.AD(s.Org, secretField)); err != nil {
			return before, after, fmt.Errorf("seal sso client secret: %w", err)
		}
	}
	if err = s.DB.WithContext(ctx).Save(&r).Error; err != nil {
		return before, after, fmt.Errorf("save sso config: %w", err)
	}
	return before, after, nil
}

func (s *Store) validate(ctx context.Context, before Config, u Update, deptExists DepartmentExists) (Config, error) {
	v := apperr.Validation()
	c := Config{ProviderName: strings.TrimSpace(u.ProviderName), IssuerURL: strings.TrimSpace(u.IssuerURL),
		ClientID: strings.TrimSpace(u.ClientID), ClientSecret: before.ClientSecret, EmailClaim: strings.TrimSpace(u.EmailClaim),
		GroupsClaim: strings.TrimSpace(u.GroupsClaim), Enabled: u.Enabled, PasswordLoginDisabled: u.PasswordLoginDisabled,
		LastSuccessAt: before.LastSuccessAt}
	if u.ClientSecret != nil && strings.TrimSpace(*u.ClientSecret) != "" {
		c.ClientSecret = strings.TrimSpace(*u.ClientSecret)
	}
	if c.IssuerURL != before.IssuerURL || c.ClientID != before.ClientID {
		// A different provider has not proven itself yet.
		c.LastSuccessAt = nil
	}
	if len(c.ProviderName) > 60 {
		v.Add("provider_name", "Provider name must be at most 60 characters.")
	}
	if msg := checkIssuer(c.IssuerURL); msg != "" {
		v.Add("issuer_url", "%s", msg)
	}
	if c.ClientID == "" || len(c.ClientID) > 500 {
		v.Add("client_id", "Client ID is required (at most 500 characters).")
	}
	if len(c.ClientSecret) > 2000 {
		v.Add("client_secret", "Client secret must be at most 2000 characters.")
	}
	if c.Enabled && c.ClientSecret == "" {
		v.Add("client_secret", "Set the client secret the provider issued before enabling sign-in.")
	}
	c.Scopes = cleanList(u.Scopes)
	if len(c.Scopes) == 0 {
		c.Scopes = DefaultScopes()
	}
	if !slices.Contains(c.Scopes, "openid") {
		v.Add("scopes", "Scopes must include \"openid\".")
	}
	if c.EmailClaim == "" {
		c.EmailClaim = "email"
	}
	if c.GroupsClaim == "" {
		c.GroupsClaim = "groups"
	}
	for _, f := range []struct{ field, val string }{{"email_claim", c.EmailClaim}, {"groups_claim", c.GroupsClaim}} {
		if len(f.val) > 100 || strings.ContainsAny(f.val, " \t\n") {
			v.Add(f.field, "A claim name is one word of at most 100 characters.")
		}
	}
	for _, d := range cleanList(u.AllowedDomains) {
		d = strings.ToLower(strings.TrimPrefix(d, "@"))
		if !validDomain(d) {
			v.Add("allowed_domains", "%q is not a domain name (example.com).", d)
			continue
		}
		c.AllowedDomains = append(c.AllowedDomains, d)
	}
	for i, m := range u.Mappings {
		m.Group = strings.TrimSpace(m.Group)
		if m.Group == "" || len(m.Group) > 200 {
			v.Add("mappings", "Mapping %d: the group name is required (at most 200 characters).", i+1)
			continue
		}
		if msg := rbac.ValidAssignment(m.Assignment("")); msg != "" {
			v.Add("mappings", "Mapping %d (%s): %s", i+1, m.Group, msg)
			continue
		}
		if m.DepartmentID != 0 {
			ok, err := deptExists(ctx, m.DepartmentID)
			if err != nil {
				return c, err
			}
			if !ok {
				v.Add("mappings", "Mapping %d (%s): department %d does not exist.", i+1, m.Group, m.DepartmentID)
				continue
			}
		}
		if !slices.Contains(c.Mappings, m) {
			c.Mappings = append(c.Mappings, m)
		}
	}
	if c.PasswordLoginDisabled && (!c.Enabled || c.LastSuccessAt == nil) {
		v.Add("password_login_disabled", "Password sign-in can be turned off once single sign-on is enabled and someone has signed in through it.")
	}
	return c, v.Err()
}

// checkIssuer explains what is wrong with an issuer URL, or "". Plain
// http is accepted only for loopback addresses (a provider on the same
// machine, as in development and tests).
func checkIssuer(s string) string {
	if s == "" {
		return "Issuer URL is required (for example https://login.example.com/realms/acme)."
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "Issuer URL must be an absolute https:// URL without query, fragment or credentials."
	}
	switch u.Scheme {
	case "https":
	case "http":
		h := u.Hostname()
		if h != "localhost" && h != "127.0.0.1" && h != "::1" {
			return "Issuer URL must use https:// (plain http only for localhost)."
		}
	default:
		return "Issuer URL must use https://."
	}
	if len(s) > 500 {
		return "Issuer URL must be at most 500 characters."
	}
	return ""
}

func validDomain(d string) bool {
	if len(d) < 3 || len(d) > 253 || !strings.Contains(d, ".") || strings.HasPrefix(d, ".") || strings.HasSuffix(d, ".") {
		return false
	}
	for _, r := range d {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

// cleanList splits entries on commas and white space, dropping blanks
// and repeats.
func cleanList(in []string) []string {
	var out []string
	for _, s := range in {
		for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' }) {
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	return out
}

// MarkSuccess records that someone signed in through the provider.
func (s *Store) MarkSuccess(ctx context.Context, db *gorm.DB) error {
	return db.WithContext(ctx).Model(&row{}).Where("id = 1").Update("last_success_at", s.now()).Error
}

// DomainAllowed reports whether email's domain is one of the allowed
// domains (any domain when none are listed).
func (c Config) DomainAllowed(email string) bool {
	if len(c.AllowedDomains) == 0 {
		return true
	}
	_, dom, ok := strings.Cut(email, "@")
	return ok && slices.Contains(c.AllowedDomains, strings.ToLower(dom))
}

// Desired is the set of roles the mapping gives a user in groups.
func (c Config) Desired(subject string, groups []string) []rbac.Assignment {
	var out []rbac.Assignment
	for _, m := range c.Mappings {
		if slices.Contains(groups, m.Group) {
			a := m.Assignment(subject)
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}
