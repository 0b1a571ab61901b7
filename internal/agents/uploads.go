package agents

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
)

// Upload kinds.
const (
	// UploadSkill is a skill bundle: an archive a skill names as
	// "upload:<name>", unpacked at the skill's mount path.
	UploadSkill = "skill"
	// UploadFile is a file written into every session's workspace at its
	// name (a relative path).
	UploadFile = "file"
)

// MaxUploadBytes caps one bundle or file. The page and the API's error
// both state it.
const MaxUploadBytes = 50 << 20

// Archive formats of skill bundles.
const (
	FormatTarGz = "tar.gz"
	FormatZip   = "zip"
)

// Upload is a skill bundle or file stored for an agent in the org's
// database. Content is read only for preparing a session's workspace
// (UploadContent); listings carry metadata.
type Upload struct {
	ID        int64 `gorm:"primaryKey"`
	AgentID   int64
	Kind      string
	Name      string
	Format    string
	Size      int64
	SHA256    string `gorm:"column:sha256"`
	Content   []byte `gorm:"column:content"`
	CreatedBy string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// TableName binds Upload to its table.
func (Upload) TableName() string { return "agent_uploads" }

// UploadInput is one upload: Kind, Name (a bundle's name, or a file's path
// in the workspace), the original file name (a bundle's format is read
// from it: .tar.gz, .tgz or .zip) and the bytes.
type UploadInput struct {
	Kind     string
	Name     string
	FileName string
	Body     []byte
	By       string
}

var uploadPathRE = regexp.MustCompile(`^[A-Za-z0-9_.][A-Za-z0-9_.@+-]*(/[A-Za-z0-9_.][A-Za-z0-9_.@+-]*)*$`)

// ArchiveFormat is the bundle format a file name ends with ("" for none).
func ArchiveFormat(name string) string {
	n := strings.ToLower(name)
	switch {
	case strings.HasSuffix(n, ".tar.gz"), strings.HasSuffix(n, ".tgz"):
		return FormatTarGz
	case strings.HasSuffix(n, ".zip"):
		return FormatZip
	}
	return ""
}

// checkUpload validates in and returns the row to store (without ids and
// times).
func checkUpload(in UploadInput) (Upload, error) {
	v := apperr.Validation()
	u := Upload{Kind: in.Kind, Name: strings.TrimSpace(in.Name), Size: int64(len(in.Body)), Content: in.Body, CreatedBy: in.By}
	switch in.Kind {
	case UploadSkill:
		if !skillNameRE.MatchString(u.Name) {
			v.Add("name", "A bundle's name must be 1–64 lowercase letters, digits, dots, dashes or underscores (skills name it as upload:<name>).")
		}
		if u.Format = ArchiveFormat(in.FileName); u.Format == "" {
			v.Add("file", "A skill bundle must be a .tar.gz, .tgz or .zip archive; %q is none of these.", in.FileName)
		}
	case UploadFile:
		if !uploadPathRE.MatchString(u.Name) || len(u.Name) > 512 || hasDotDot(u.Name) {
			v.Add("name", "A file's path must be relative to the workspace (no leading /, no \"..\", letters, digits, . _ - + @ and / only, at most 512 characters), e.g. notes/brief.md.")
		}
	default:
		v.Add("kind", "The kind must be \"skill\" (an archive) or \"file\".")
	}
	if u.Size == 0 {
		v.Add("file", "The upload is empty.")
	}
	if u.Size > MaxUploadBytes {
		v.Add("file", "The upload is %d bytes, more than the 50 MiB limit per bundle or file.", u.Size)
	}
	if err := v.Err(); err != nil {
		return u, err
	}
	if u.Kind == UploadSkill {
		if err := checkArchive(u.Format, in.Body); err != nil {
			v.Add("file", "The bundle is not a readable %s archive: %v.", u.Format, err)
			return u, v.Err()
		}
	}
	sum := sha256.Sum256(in.Body)
	u.SHA256 = hex.EncodeToString(sum[:])
	return u, nil
}

func hasDotDot(p string) bool {
	for _, part := range strings.Split(p, "/") {
		if part == ".." || part == "." {
			return true
		}
	}
	return false
}

// checkArchive reads every entry of an archive, so a truncated or
// mislabelled bundle is refused at upload rather than at a session's
// start; an entry that would land outside its directory is refused too
// (agentd refuses it as well when unpacking).
func checkArchive(format string, b []byte) error {
	safe := func(name string) error {
		clean := path.Clean(strings.TrimPrefix(name, "./"))
		if strings.HasPrefix(name, "/") || clean == ".." || strings.HasPrefix(clean, "../") {
			return fmt.Errorf("entry %q leaves the bundle's directory", name)
		}
		return nil
	}
	switch format {
	case FormatZip:
		zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return err
		}
		for _, f := range zr.File {
			if err := safe(f.Name); err != nil {
				return err
			}
		}
		return nil
	case FormatTarGz:
		gz, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return err
		}
		tr := tar.NewReader(gz)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := safe(h.Name); err != nil {
				return err
			}
			if _, err := io.Copy(io.Discard, tr); err != nil {
				return err
			}
		}
	}
	return fmt.Errorf("unknown format %q", format)
}

// Uploads lists the bundles and files of an agent actor may see, without
// their contents: whoever may read the agent (its department's members,
// auditors) sees names, sizes and hashes.
func (s *Service) Uploads(ctx context.Context, actor *authz.Actor, agentID int64) ([]Upload, error) {
	if _, err := s.visible(ctx, actor, agentID, false); err != nil {
		return nil, err
	}
	var out []Upload
	if err := s.DB.WithContext(ctx).Omit("content").Where("agent_id = ?", agentID).Order("kind, name").Find(&out).Error; err != nil {
		return nil, fmt.Errorf("read agent uploads: %w", err)
	}
	return out, nil
}

// UploadContent returns one bundle or file of an agent with its bytes,
// for preparing a session's workspace. Only who may change the agent (and
// the system, which prepares sessions) reads contents. One at a time: an
// agent's uploads together may be many times the 50 MiB of one, and a
// console preparing several sessions at once holds each one's.
func (s *Service) UploadContent(ctx context.Context, actor *authz.Actor, agentID int64, kind, name string) (Upload, error) {
	if _, err := s.visible(ctx, actor, agentID, true); err != nil {
		return Upload{}, err
	}
	var out []Upload
	if err := s.DB.WithContext(ctx).Where("agent_id = ? AND kind = ? AND name = ?", agentID, kind, name).Limit(1).Find(&out).Error; err != nil {
		return Upload{}, fmt.Errorf("read agent upload: %w", err)
	}
	if len(out) == 0 {
		return Upload{}, apperr.New(apperr.ErrNotFound, "upload_not_found", "The agent has no %s named %q.", kind, name)
	}
	return out[0], nil
}

// PutUpload stores (or replaces) a bundle or file of an agent actor may
// change. before is the replaced upload (nil for a new one); neither
// carries content back.
func (s *Service) PutUpload(ctx context.Context, actor *authz.Actor, agentID int64, in UploadInput) (before *Upload, after Upload, err error) {
	if _, err = s.visible(ctx, actor, agentID, true); err != nil {
		return nil, after, err
	}
	u, err := checkUpload(in)
	if err != nil {
		return nil, after, err
	}
	now := s.now()
	var cur []Upload
	if err = s.DB.WithContext(ctx).Omit("content").Where("agent_id = ? AND kind = ? AND name = ?", agentID, u.Kind, u.Name).Limit(1).Find(&cur).Error; err != nil {
		return nil, after, fmt.Errorf("read agent upload: %w", err)
	}
	u.AgentID, u.UpdatedAt = agentID, now
	if len(cur) == 1 {
		before = &cur[0]
		err = s.DB.WithContext(ctx).Model(&Upload{}).Where("id = ?", cur[0].ID).Updates(map[string]any{
			"format": u.Format, "size": u.Size, "sha256": u.SHA256, "content": u.Content, "created_by": u.CreatedBy, "updated_at": now}).Error
		u.ID, u.CreatedAt = cur[0].ID, cur[0].CreatedAt
	} else {
		u.CreatedAt = now
		err = s.DB.WithContext(ctx).Create(&u).Error
	}
	if err != nil {
		return nil, after, fmt.Errorf("store agent upload: %w", err)
	}
	u.Content = nil
	return before, u, nil
}

// RemoveUpload deletes a bundle or file of an agent actor may change.
func (s *Service) RemoveUpload(ctx context.Context, actor *authz.Actor, agentID int64, kind, name string) (Upload, error) {
	if _, err := s.visible(ctx, actor, agentID, true); err != nil {
		return Upload{}, err
	}
	var cur []Upload
	if err := s.DB.WithContext(ctx).Omit("content").Where("agent_id = ? AND kind = ? AND name = ?", agentID, kind, name).Limit(1).Find(&cur).Error; err != nil {
		return Upload{}, fmt.Errorf("read agent upload: %w", err)
	}
	if len(cur) == 0 {
		return Upload{}, apperr.New(apperr.ErrNotFound, "upload_not_found", "The agent has no %s named %q.", kind, name)
	}
	if err := s.DB.WithContext(ctx).Delete(&Upload{}, cur[0].ID).Error; err != nil {
		return Upload{}, fmt.Errorf("delete agent upload: %w", err)
	}
	return cur[0], nil
}
