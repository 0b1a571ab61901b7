// Package platform holds platform administrators: their accounts in the
// catalog, sign-in with throttling, and server-side sign-in (login)s that back the
// JWTs so logout takes effect at once.
package platform

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Admin is a platform administrator.
type Admin struct {
	ID                 int64 `gorm:"primaryKey"`
	Email              string
	Name               string
	PasswordHash       string `json:"-"`
	MustChangePassword bool
	CreatedAt          time.Time
	LastLoginAt        *time.Time
}

// TableName binds Admin to its table.
func (Admin) TableName() string { return "platform_admins" }

type loginRow struct {
	ID        string `gorm:"primaryKey"`
	AdminID   int64
	CreatedAt time.Time
	ExpiresAt time.Time
	RevokedAt *time.Time
}

func (loginRow) TableName() string { return "platform_logins" }

// Service signs admins in and out.
type Service struct {
	DB       *gorm.DB
	Signer   *auth.Signer
	Throttle *auth.Throttle
	Now      func() time.Time
	// Sleep is how failed attempts are slowed; tests replace it.
	Sleep func(context.Context, time.Duration)
	// Passwords is the cost of the password hashes it makes (zero: the
	// default).
	Passwords auth.PasswordCost
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

// Count returns how many admins exist (bootstrap checks this).
func (s *Service) Count(ctx context.Context) (int64, error) {
	var n int64
	err := s.DB.WithContext(ctx).Model(&Admin{}).Count(&n).Error
	return n, err
}

// CreateAdmin adds an admin with a chosen password.
func (s *Service) CreateAdmin(ctx context.Context, email, name, password string, mustChange bool) (Admin, error) {
	email = auth.NormalizeEmail(email)
	v := apperr.Validation()
	if msg := auth.ValidateEmail(email); msg != "" {
		v.Add("email", "%s", msg)
	}
	if len(password) < auth.MinPasswordLength {
		v.Add("password", "%s", auth.ErrWeakPassword.Error())
	}
	if err := v.Err(); err != nil {
		return Admin{}, err
	}
	h, err := s.Passwords.Hash(password)
	if err != nil {
		return Admin{}, err
	}
	a := Admin{Email: email, Name: name, PasswordHash: h, MustChangePassword: mustChange, CreatedAt: s.now()}
	if err := s.DB.WithContext(ctx).Create(&a).Error; err != nil {
		if store.IsUniqueViolation(err) {
			return Admin{}, &apperr.ValidationError{Fields: map[string]string{"email": "An admin with this email already exists."}}
		}
		return Admin{}, fmt.Errorf("create admin: %w", err)
	}
	return a, nil
}

// ErrBadCredentials never says which part was wrong.
var ErrBadCredentials = apperr.New(apperr.ErrUnauthorized, "bad_credentials", "The email or password is incorrect.")

// Login is the result of a successful sign-in.
type Login struct {
	Admin     Admin
	Token     string
	ExpiresAt time.Time
}

// Login checks credentials with per-address and per-account throttling and
// opens a login. It returns ErrBadCredentials or a too-many error; the
// caller audits either outcome.
func (s *Service) Login(ctx context.Context, email, password, ip string) (Login, error) {
	email = auth.NormalizeEmail(email)
	var a Admin
	err := s.Throttle.Attempt(ctx, auth.LoginKeys{Address: "platform-ip:" + ip, Account: "platform-acct:" + email}, s.Sleep, func() (bool, error) {
		res := s.DB.WithContext(ctx).Where("email = ?", email).Limit(1).Find(&a)
		if res.Error != nil {
			return false, fmt.Errorf("read admin: %w", res.Error)
		}
		return s.Passwords.Check(a.PasswordHash, password), nil
	})
	if err != nil {
		return Login{}, LoginError(err)
	}
	now := s.now()
	sess := loginRow{ID: auth.RandomToken(18), AdminID: a.ID, CreatedAt: now, ExpiresAt: now.Add(s.Signer.TTL())}
	if err := s.DB.WithContext(ctx).Create(&sess).Error; err != nil {
		return Login{}, fmt.Errorf("create login: %w", err)
	}
	if err := s.DB.WithContext(ctx).Model(&Admin{}).Where("id = ?", a.ID).Update("last_login_at", now).Error; err != nil {
		return Login{}, fmt.Errorf("record sign-in time: %w", err)
	}
	tok, exp, err := s.Signer.Issue(fmt.Sprint(a.ID), sess.ID, a.Email)
	if err != nil {
		return Login{}, err
	}
	return Login{Admin: a, Token: tok, ExpiresAt: exp}, nil
}

// LoginError maps throttle outcomes to the messages people see.
func LoginError(err error) error {
	var le *auth.LockedError
	switch {
	case errors.As(err, &le):
		return apperr.New(apperr.ErrTooMany, "login_locked",
			"Too many failed sign-in attempts. Try again after %s.", le.Until.UTC().Format(time.RFC3339))
	case errors.Is(err, auth.ErrBadCredentials):
		return ErrBadCredentials
	}
	return err
}

// Authenticate verifies a token and its live login and returns the admin.
func (s *Service) Authenticate(ctx context.Context, token string) (Admin, *auth.Claims, error) {
	c, err := s.Signer.Verify(token)
	if err != nil {
		return Admin{}, nil, err
	}
	var sess loginRow
	res := s.DB.WithContext(ctx).Where("id = ?", c.LoginID).Limit(1).Find(&sess)
	if res.Error != nil {
		return Admin{}, nil, fmt.Errorf("read login: %w", res.Error)
	}
	if res.RowsAffected == 0 || sess.RevokedAt != nil || s.now().After(sess.ExpiresAt) || fmt.Sprint(sess.AdminID) != c.Subject {
		return Admin{}, nil, fmt.Errorf("%w: sign-in ended", auth.ErrInvalidToken)
	}
	var a Admin
	res = s.DB.WithContext(ctx).Where("id = ?", sess.AdminID).Limit(1).Find(&a)
	if res.Error != nil || res.RowsAffected == 0 {
		return Admin{}, nil, fmt.Errorf("%w: admin gone", auth.ErrInvalidToken)
	}
	return a, c, nil
}

// LoginActive reports whether platform sign-in sid of adminID is live
// (not revoked or expired, admin still present).
func (s *Service) LoginActive(ctx context.Context, sid, adminID string) (bool, error) {
	if sid == "" {
		return false, nil
	}
	var sess loginRow
	res := s.DB.WithContext(ctx).Where("id = ?", sid).Limit(1).Find(&sess)
	if res.Error != nil {
		return false, fmt.Errorf("read login: %w", res.Error)
	}
	return res.RowsAffected == 1 && sess.RevokedAt == nil && s.now().Before(sess.ExpiresAt) && fmt.Sprint(sess.AdminID) == adminID, nil
}

// Logout revokes the login behind claims.
func (s *Service) Logout(ctx context.Context, loginID string) error {
	now := s.now()
	return s.DB.WithContext(ctx).Model(&loginRow{}).Where("id = ? AND revoked_at IS NULL", loginID).Update("revoked_at", now).Error
}

// Bootstrap creates the first admin when none exists. With no password
// given it generates a one-time password, returned so the caller can print
// it once. created is false when admins already existed.
func (s *Service) Bootstrap(ctx context.Context, email, password string) (created bool, oneTime string, err error) {
	n, err := s.Count(ctx)
	if err != nil {
		return false, "", fmt.Errorf("count admins: %w", err)
	}
	if n > 0 {
		return false, "", nil
	}
	if email == "" {
		email = "admin@localhost.localdomain"
	}
	mustChange := false
	if password == "" {
		password = auth.RandomPassword()
		oneTime = password
		mustChange = true
	}
	if _, err := s.CreateAdmin(ctx, email, "Platform admin", password, mustChange); err != nil {
		var ve *apperr.ValidationError
		if errors.As(err, &ve) {
			return false, "", fmt.Errorf("GATEHOUSE_ADMIN_EMAIL / GATEHOUSE_ADMIN_PASSWORD: %w", err)
		}
		return false, "", err
	}
	return true, oneTime, nil
}

// ChangePassword replaces an admin's password after checking the current
// one, and clears the must-change flag.
func (s *Service) ChangePassword(ctx context.Context, adminID, current, next string) error {
	var a Admin
	res := s.DB.WithContext(ctx).Where("id = ?", adminID).Limit(1).Find(&a)
	if res.Error != nil {
		return fmt.Errorf("read admin: %w", res.Error)
	}
	// An unknown admin has an empty hash, which never matches.
	h, err := s.Passwords.NewHash(a.PasswordHash, current, next)
	if err != nil {
		return err
	}
	return s.DB.WithContext(ctx).Model(&Admin{}).Where("id = ?", a.ID).
		Updates(map[string]any{"password_hash": h, "must_change_password": false}).Error
}
