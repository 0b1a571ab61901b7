// Package directory holds an org's principals: user accounts and their
// sign-ins (logins), departments, and API keys. Every method works on one org's
// database; nothing here can reach another org.
package directory

import (
	"context"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/auth"
	"github.com/gatehouse/gatehouse/internal/store"
)

// User statuses.
const (
	StatusActive   = "active"
	StatusDisabled = "disabled"
)

// Directory is one org's principals.
type Directory struct {
	DB  *gorm.DB
	Now func() time.Time
	// Passwords is the cost of the password hashes it makes (zero: the
	// default).
	Passwords auth.PasswordCost
}

// In is d working inside tx.
func (d *Directory) In(tx *gorm.DB) *Directory {
	c := *d
	c.DB = tx
	return &c
}

func (d *Directory) now() time.Time {
	if d.Now != nil {
		return d.Now().UTC()
	}
	return time.Now().UTC()
}

// User is an org account.
type User struct {
	ID                 int64 `gorm:"primaryKey"`
	Email              string
	Name               string
	PasswordHash       string
	Status             string
	MustChangePassword bool
	CreatedAt          time.Time
	UpdatedAt          time.Time
	LastLoginAt        *time.Time
}

// TableName binds User to its table.
func (User) TableName() string { return "users" }

// CreateUser adds an account with a one-time password that must be changed
// at first sign-in; the password is returned once and never stored.
func (d *Directory) CreateUser(ctx context.Context, email, name string) (User, string, error) {
	email = auth.NormalizeEmail(email)
	name = strings.TrimSpace(name)
	v := apperr.Validation()
	if msg := auth.ValidateEmail(email); msg != "" {
		v.Add("email", "%s", msg)
	}
	if len(name) > 200 {
		v.Add("name", "Name must be at most 200 characters.")
	}
	if err := v.Err(); err != nil {
		return User{}, "", err
	}
	otp := auth.RandomPassword()
	h, err := d.Passwords.Hash(otp)
	if err != nil {
		return User{}, "", err
	}
	now := d.now()
	u := User{Email: email, Name: name, PasswordHash: h, Status: StatusActive, MustChangePassword: true, CreatedAt: now, UpdatedAt: now}
	if err := d.DB.WithContext(ctx).Create(&u).Error; err != nil {
		if store.IsUniqueViolation(err) {
			return User{}, "", &apperr.ValidationError{Fields: map[string]string{"email": "A user with this email already exists in this organization."}}
		}
		return User{}, "", fmt.Errorf("create user: %w", err)
	}
	return u, otp, nil
}

// ListUsers returns users by id after the cursor, at most limit.
func (d *Directory) ListUsers(ctx context.Context, after int64, limit int) ([]User, error) {
	var us []User
	q := d.DB.WithContext(ctx).Order("id").Where("id > ?", after)
	if limit > 0 {
		q = q.Limit(limit)
	}
	if err := q.Find(&us).Error; err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	return us, nil
}

// GetUser returns one user.
func (d *Directory) GetUser(ctx context.Context, id int64) (User, error) {
	return store.ByID[User](ctx, d.DB, id, "user")
}

// UsersByID loads several users at once (for member lists).
func (d *Directory) UsersByID(ctx context.Context, ids []int64) (map[int64]User, error) {
	out := map[int64]User{}
	if len(ids) == 0 {
		return out, nil
	}
	var us []User
	if err := d.DB.WithContext(ctx).Where("id IN ?", ids).Find(&us).Error; err != nil {
		return nil, fmt.Errorf("read users: %w", err)
	}
	for _, u := range us {
		out[u.ID] = u
	}
	return out, nil
}

// UpdateUser changes name and/or status. Disabling revokes the user's
// sign-ins so it takes effect on the next request.
func (d *Directory) UpdateUser(ctx context.Context, id int64, name, status *string) (before, after User, err error) {
	before, err = d.GetUser(ctx, id)
	if err != nil {
		return
	}
	after = before
	v := apperr.Validation()
	if name != nil {
		n := strings.TrimSpace(*name)
		if len(n) > 200 {
			v.Add("name", "Name must be at most 200 characters.")
		}
		after.Name = n
	}
	if status != nil {
		if *status != StatusActive && *status != StatusDisabled {
			v.Add("status", "Status must be \"active\" or \"disabled\".")
		}
		after.Status = *status
	}
	if err = v.Err(); err != nil {
		return
	}
	after.UpdatedAt = d.now()
	err = d.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Model(&User{}).Where("id = ?", id).Updates(map[string]any{"name": after.Name, "status": after.Status, "updated_at": after.UpdatedAt}).Error; err != nil {
			return fmt.Errorf("update user: %w", err)
		}
		if after.Status == StatusDisabled && before.Status != StatusDisabled {
			return revokeSubject(tx, UserSubject(id), after.UpdatedAt)
		}
		return nil
	})
	return
}

// ResetPassword sets a new one-time password, ends the user's sign-ins,
// revokes their personal API keys and returns the password once.
func (d *Directory) ResetPassword(ctx context.Context, id int64) (string, error) {
	if _, err := d.GetUser(ctx, id); err != nil {
		return "", err
	}
	otp := auth.RandomPassword()
	h, err := d.Passwords.Hash(otp)
	if err != nil {
		return "", err
	}
	now := d.now()
	err = d.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Model(&User{}).Where("id = ?", id).Updates(map[string]any{"password_hash": h, "must_change_password": true, "updated_at": now}).Error; err != nil {
			return err
		}
		// A reset is how a suspected compromise is answered: personal keys
		// the old password could have minted go too.
		if err := tx.Model(&APIKey{}).Where("owner_user_id = ? AND revoked_at IS NULL", id).Update("revoked_at", now).Error; err != nil {
			return err
		}
		return revokeSubject(tx, UserSubject(id), now)
	})
	if err != nil {
		return "", fmt.Errorf("reset password: %w", err)
	}
	return otp, nil
}

// ChangePassword replaces the user's password after checking the current one.
func (d *Directory) ChangePassword(ctx context.Context, id int64, current, next string) error {
	u, err := d.GetUser(ctx, id)
	if err != nil {
		return err
	}
	h, err := d.Passwords.NewHash(u.PasswordHash, current, next)
	if err != nil {
		return err
	}
	return d.DB.WithContext(ctx).Model(&User{}).Where("id = ?", id).
		Updates(map[string]any{"password_hash": h, "must_change_password": false, "updated_at": d.now()}).Error
}

// CheckLogin looks a user up by email and checks the password. It returns
// ok=false for an unknown email, a wrong password or a disabled account
// alike, so the caller cannot tell them apart.
func (d *Directory) CheckLogin(ctx context.Context, email, password string) (User, bool, error) {
	var u User
	res := d.DB.WithContext(ctx).Where("email = ?", auth.NormalizeEmail(email)).Limit(1).Find(&u)
	if res.Error != nil {
		return u, false, fmt.Errorf("read user: %w", res.Error)
	}
	ok := d.Passwords.Check(u.PasswordHash, password) && u.Status == StatusActive
	return u, ok, nil
}

// UserSubject is the login subject of a user ("user:<id>"), the same
// string casbin uses.
func UserSubject(id int64) string { return fmt.Sprintf("user:%d", id) }

type loginRow struct {
	ID        string `gorm:"primaryKey"`
	Subject   string
	CreatedAt time.Time
	ExpiresAt time.Time
	RevokedAt *time.Time
}

func (loginRow) TableName() string { return "user_logins" }

// CreateLogin records a sign-in (login) for subject and returns its id.
func (d *Directory) CreateLogin(ctx context.Context, subject string, ttl time.Duration) (string, error) {
	now := d.now()
	s := loginRow{ID: auth.RandomToken(18), Subject: subject, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	if err := d.DB.WithContext(ctx).Create(&s).Error; err != nil {
		return "", fmt.Errorf("create login: %w", err)
	}
	if strings.HasPrefix(subject, "user:") {
		d.DB.WithContext(ctx).Model(&User{}).Where("id = ?", strings.TrimPrefix(subject, "user:")).Update("last_login_at", now)
	}
	return s.ID, nil
}

// LoginValid reports whether login id of subject is live.
func (d *Directory) LoginValid(ctx context.Context, id, subject string) (bool, error) {
	var s loginRow
	res := d.DB.WithContext(ctx).Where("id = ?", id).Limit(1).Find(&s)
	if res.Error != nil {
		return false, fmt.Errorf("read login: %w", res.Error)
	}
	return res.RowsAffected == 1 && s.Subject == subject && s.RevokedAt == nil && d.now().Before(s.ExpiresAt), nil
}

// RevokeLogin ends one sign-in.
func (d *Directory) RevokeLogin(ctx context.Context, id string) error {
	return d.DB.WithContext(ctx).Model(&loginRow{}).Where("id = ? AND revoked_at IS NULL", id).Update("revoked_at", d.now()).Error
}

func revokeSubject(tx *gorm.DB, subject string, now time.Time) error {
	return tx.Model(&loginRow{}).Where("subject = ? AND revoked_at IS NULL", subject).Update("revoked_at", now).Error
}

// UserByEmail finds a user by email.
func (d *Directory) UserByEmail(ctx context.Context, email string) (User, error) {
	var u User
	email = auth.NormalizeEmail(email)
	res := d.DB.WithContext(ctx).Where("email = ?", email).Limit(1).Find(&u)
	if res.Error != nil {
		return u, fmt.Errorf("read user: %w", res.Error)
	}
	if res.RowsAffected == 0 {
		return u, apperr.New(apperr.ErrNotFound, "user_not_found", "No user with the email %s exists in this organization.", email)
	}
	return u, nil
}
