package agents

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// skillProblem names the first rule s breaks, as the field ("name",
// "source", "mount_path" or "sha256") and the rest of a sentence that
// starts with it; "" when s is well formed. Duplicates are the caller's
// to find.
func skillProblem(s Skill) (field, rest string) {
	switch {
	case !skillNameRE.MatchString(s.Name):
		return "name", " must be 1–64 lowercase letters, digits, dots, dashes or underscores."
	case s.Source == "":
		return "source", " is required (an https:// URL, an absolute path or upload:<name>)."
	case strings.HasPrefix(s.Source, UploadSource) && !skillNameRE.MatchString(strings.TrimPrefix(s.Source, UploadSource)):
		return "source", fmt.Sprintf(" %q must name an uploaded bundle: upload: followed by 1–64 lowercase letters, digits, dots, dashes or underscores.", s.Source)
	case !strings.HasPrefix(s.Source, UploadSource) && !strings.HasPrefix(s.Source, "https://") && !strings.HasPrefix(s.Source, "http://") && !strings.HasPrefix(s.Source, "/"):
		return "source", " must be an http(s) URL, an absolute path or upload:<name>."
	case strings.HasPrefix(s.Source, "/") && strings.Contains(s.Source, ".."):
		return "source", " must be an absolute path without \"..\"."
	case s.MountPath != "" && (!strings.HasPrefix(s.MountPath, "/") || strings.Contains(s.MountPath, "..")):
		return "mount_path", " must be an absolute path without \"..\"."
	case s.SHA256 != "" && !sha256RE.MatchString(s.SHA256):
		return "sha256", " must be 64 lowercase hexadecimal digits."
	case s.SHA256 != "" && strings.HasPrefix(s.Source, "/"):
		return "sha256", " cannot pin a path source (a directory has no single hash); pin a URL or an uploaded bundle."
	}
	return "", ""
}

// skillLabels are how the agent page names a skill's fields.
var skillLabels = map[string]string{"name": "The name", "source": "The source", "mount_path": "The mount path", "sha256": "The SHA-256"}

// AddSkill returns config (an agent's stored configuration) with s
// appended to its skills, normalized as ParseConfig would store it. A
// problem with s is a validation error on s's own field (name, source,
// mount_path or sha256), so a form can show it beside that field; the
// result still goes through the agent's update, which checks the whole.
func AddSkill(config string, s Skill) (string, error) {
	v := apperr.Validation()
	s.Name, s.Source, s.SHA256 = strings.TrimSpace(s.Name), strings.TrimSpace(s.Source), strings.ToLower(strings.TrimSpace(s.SHA256))
	if field, rest := skillProblem(s); field != "" {
		v.Add(field, "%s%s", skillLabels[field], rest)
		return "", v.Err()
	}
	cfg, _ := ParseConfig(config, apperr.Validation())
	if slices.ContainsFunc(cfg.Skills, func(have Skill) bool { return have.Name == s.Name }) {
		v.Add("name", "The agent already has a skill named %q; remove it first to replace it.", s.Name)
		return "", v.Err()
	}
	if len(cfg.Skills) >= 100 {
		v.Add("form", "An agent has at most 100 skills.")
		return "", v.Err()
	}
	return withSkills(config, append(cfg.Skills, s))
}

// RemoveSkill returns config without the skill named name; naming a
// skill the agent does not have is a validation error on "name" (the
// agent itself was found).
func RemoveSkill(config, name string) (string, error) {
	cfg, _ := ParseConfig(config, apperr.Validation())
	i := slices.IndexFunc(cfg.Skills, func(s Skill) bool { return s.Name == name })
	if i < 0 {
		v := apperr.Validation()
		v.Add("name", "The agent has no skill named %q.", name)
		return "", v.Err()
	}
	return withSkills(config, slices.Delete(cfg.Skills, i, i+1))
}

// withSkills replaces config's skills, keeping every other field as
// stored. A configuration that does not parse is refused as it would be
// on save.
func withSkills(config string, skills []Skill) (string, error) {
	v := apperr.Validation()
	cfg, _ := ParseConfig(config, v)
	if err := v.Err(); err != nil {
		return "", err
	}
	cfg.Skills = skills
	b, err := json.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("encode the configuration: %w", err)
	}
	_, norm := ParseConfig(string(b), v)
	return norm, v.Err()
}

// Shown is the skill's source as pages, the API and the audit log show
// it: a URL without credentials, query or fragment (a signed download
// link carries its secret there).
func (s Skill) Shown() string {
	u, err := url.Parse(s.Source)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") {
		return s.Source
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}
