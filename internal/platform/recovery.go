package platform

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/auth"
)

// Actions of the recovery commands in the platform audit log.
const (
	ActionAdminCreate        = "platform.admin_create"
	ActionAdminPasswordReset = "platform.admin_password_reset"
)

// Admins lists every platform admin by email, for the operator who lost
// track of which address holds an account.
func (s *Service) Admins(ctx context.Context) ([]Admin, error) {
	var as []Admin
	if err := s.DB.WithContext(ctx).Order("email").Find(&as).Error; err != nil {
		return nil, fmt.Errorf("list admins: %w", err)
	}
	return as, nil
}

// CreateWithOneTimePassword adds an admin whose generated password must be
// changed at first sign-in, recording it in log as actor in the same
// transaction: no account exists without its record.
func (s *Service) CreateWithOneTimePassword(ctx context.Context, email string, log *audit.Log, actor audit.Actor) (Admin, string, error) {
	otp := auth.RandomPassword()
	var a Admin
	err := s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		if a, err = (&Service{DB: tx, Now: s.Now}).CreateAdmin(ctx, email, "Platform admin", otp, true); err != nil {
			return err
		}
		return appendAdminEvent(ctx, tx, log, actor, ActionAdminCreate, a)
	})
	if err != nil {
		return Admin{}, "", err
	}
	return a, otp, nil
}

// ResetPassword replaces admin email's password with a generated one-time
// password, ends every sign-in they hold (platform sign-ins, and so the
// orgs they entered), and records it in log as actor in the same
// transaction. It is how a locked-out admin regains access: whoever can
// run the console's binary against its data already holds its keys.
func (s *Service) ResetPassword(ctx context.Context, email string, log *audit.Log, actor audit.Actor) (Admin, string, error) {
	email = auth.NormalizeEmail(email)
	otp := auth.RandomPassword()
	h, err := s.Passwords.Hash(otp)
	if err != nil {
		return Admin{}, "", err
	}
	var a Admin
	err = s.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Where("email = ?", email).Limit(1).Find(&a)
		if res.Error != nil {
			return fmt.Errorf("read admin: %w", res.Error)
		}
		if res.RowsAffected == 0 {
			return apperr.New(apperr.ErrNotFound, "no_such_admin", "There is no platform admin with the email %q.", email)
		}
		if err := tx.Model(&Admin{}).Where("id = ?", a.ID).
			Updates(map[string]any{"password_hash": h, "must_change_password": true}).Error; err != nil {
			return fmt.Errorf("set password: %w", err)
		}
		if err := tx.Model(&loginRow{}).Where("admin_id = ? AND revoked_at IS NULL", a.ID).Update("revoked_at", s.now()).Error; err != nil {
			return fmt.Errorf("end sign-ins: %w", err)
		}
		a.MustChangePassword = true
		return appendAdminEvent(ctx, tx, log, actor, ActionAdminPasswordReset, a)
	})
	if err != nil {
		return Admin{}, "", err
	}
	return a, otp, nil
}

func appendAdminEvent(ctx context.Context, tx *gorm.DB, log *audit.Log, actor audit.Actor, action string, a Admin) error {
	e := audit.Event{Actor: actor, Action: action, Decision: audit.Allow,
		Target: audit.Target{Type: audit.ActorPlatformAdmin, ID: fmt.Sprint(a.ID), Name: a.Email}}
	if _, err := log.AppendTx(ctx, tx, e); err != nil {
		return fmt.Errorf("audit %s: %w", action, err)
	}
	return nil
}
