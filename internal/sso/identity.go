package sso

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/clip"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
)

type identityRow struct {
	Issuer      string `gorm:"primaryKey"`
	Subject     string `gorm:"primaryKey"`
	UserID      int64
	Email       string
	CreatedAt   time.Time
	LastLoginAt time.Time
}

func (identityRow) TableName() string { return "sso_identities" }

// How a sign-in found its user.
const (
	OutcomeExisting = "existing" // the provider identity was linked before
	OutcomeLinked   = "linked"   // linked now to the account with the verified e-mail
	OutcomeCreated  = "created"  // created just in time
)

// Resolve finds the user for id inside tx, linking an existing account
// by verified e-mail or creating one, and refuses disabled accounts. It
// writes nothing when it refuses.
func Resolve(ctx context.Context, tx *gorm.DB, cfg Config, id Identity, now time.Time) (directory.User, string, error) {
	dir := &directory.Directory{DB: tx}
	var link identityRow
	res := tx.WithContext(ctx).Where("issuer = ? AND subject = ?", id.Issuer, id.Subject).Limit(1).Find(&link)
	if res.Error != nil {
		return directory.User{}, "", fmt.Errorf("read sso identity: %w", res.Error)
	}
	outcome := OutcomeExisting
	var u directory.User
	var err error
	switch {
	case res.RowsAffected == 1:
		if u, err = dir.GetUser(ctx, link.UserID); err != nil {
			return u, "", err
		}
	default:
		u, err = dir.UserByEmail(ctx, id.Email)
		switch {
		case err == nil:
			// Linking hands an existing account to whoever controls the
			// address at the provider: only a verified address may.
			if id.EmailVerified == nil || !*id.EmailVerified {
				f := fail(cfg, "email_unverified", "An account with the address "+id.Email+" already exists here, and the identity provider "+
					"did not state that the address is verified (email_verified). Verify it at the provider, or ask an org admin.", nil)
				f.Email = id.Email
				return u, "", f
			}
			outcome = OutcomeLinked
		case errors.Is(err, apperr.ErrNotFound):
			u = directory.User{Email: id.Email, Name: clip.String(id.Name, 200), Status: directory.StatusActive, CreatedAt: now, UpdatedAt: now}
			// No password: the account signs in through the provider (an
			// admin may still reset one for it).
			if err := tx.WithContext(ctx).Create(&u).Error; err != nil {
				if store.IsUniqueViolation(err) {
					return u, "", apperr.New(apperr.ErrConflict, "sign_in_race", "Another sign-in for %s is under way; try again.", id.Email)
				}
				return u, "", fmt.Errorf("create user: %w", err)
			}
			outcome = OutcomeCreated
		default:
			return u, "", err
		}
	}
	if u.Status != directory.StatusActive {
		f := fail(cfg, "user_disabled", "Your account in this organization ("+u.Email+") is disabled. Ask an org admin to enable it.", nil)
		f.Email = u.Email
		return u, "", f
	}
	if outcome == OutcomeExisting {
		err = tx.WithContext(ctx).Model(&identityRow{}).Where("issuer = ? AND subject = ?", id.Issuer, id.Subject).
			Updates(map[string]any{"email": id.Email, "last_login_at": now}).Error
	} else {
		err = tx.WithContext(ctx).Create(&identityRow{Issuer: id.Issuer, Subject: id.Subject, UserID: u.ID, Email: id.Email, CreatedAt: now, LastLoginAt: now}).Error
	}
	if err != nil {
		return u, "", fmt.Errorf("record sso identity: %w", err)
	}
	return u, outcome, nil
}

type grantRow struct {
	UserID int64  `gorm:"primaryKey"`
	Role   string `gorm:"primaryKey"`
	Domain string `gorm:"primaryKey"`
}

func (grantRow) TableName() string { return "sso_grants" }

// Grants lists the roles the group mapping gave the user.
func Grants(ctx context.Context, db *gorm.DB, userID int64) ([]rbac.Assignment, error) {
	var rows []grantRow
	if err := db.WithContext(ctx).Where("user_id = ?", userID).Order("domain, role").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("read sso grants: %w", err)
	}
	out := make([]rbac.Assignment, 0, len(rows))
	for _, r := range rows {
		out = append(out, rbac.Assignment{Subject: rbac.UserSubject(userID), Role: r.Role, Domain: r.Domain})
	}
	return out, nil
}

// SetGrant records (held) or forgets (!held) that the mapping gave a role.
func SetGrant(ctx context.Context, db *gorm.DB, userID int64, a rbac.Assignment, held bool) error {
	r := grantRow{UserID: userID, Role: a.Role, Domain: a.Domain}
	var err error
	if held {
		err = db.WithContext(ctx).Where(r).FirstOrCreate(&r).Error
	} else {
		err = db.WithContext(ctx).Where("user_id = ? AND role = ? AND domain = ?", userID, a.Role, a.Domain).Delete(&grantRow{}).Error
	}
	if err != nil {
		return fmt.Errorf("record sso grant: %w", err)
	}
	return nil
}

// Plan is the role changes one sign-in makes.
type Plan struct {
	Add    []rbac.Assignment // roles the groups give that the user lacks
	Remove []rbac.Assignment // roles the mapping gave earlier that the groups no longer give
}

// PlanRoles compares the roles the groups give with those held (all of
// the user's assignments) and those the mapping gave before. A role an
// admin assigned by hand is never removed by a sign-in.
func PlanRoles(desired, held, granted []rbac.Assignment) Plan {
	in := func(xs []rbac.Assignment, a rbac.Assignment) bool {
		for _, x := range xs {
			if x == a {
				return true
			}
		}
		return false
	}
	var p Plan
	for _, a := range desired {
		if !in(held, a) {
			p.Add = append(p.Add, a)
		}
	}
	for _, a := range granted {
		if !in(desired, a) {
			p.Remove = append(p.Remove, a)
		}
	}
	return p
}
