package auth

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
)

type signingKeyRow struct {
	ID        int64  `gorm:"primaryKey"`
	KID       string `gorm:"column:kid"`
	SealedKey string
	CreatedAt time.Time
}

func (signingKeyRow) TableName() string { return "signing_keys" }

// LoadOrCreateSigningKey returns the first signing key in db's
// signing_keys table, generating and sealing one on first use; replicas
// that race to create it all end with the same one. owner is
// "catalog" or the org slug; it is bound into the sealed value so a key row
// copied between databases does not open.
func LoadOrCreateSigningKey(ctx context.Context, db *gorm.DB, box *sealed.Box, owner string) (kid string, key []byte, err error) {
	load := func() (bool, error) {
		var r signingKeyRow
		res := db.WithContext(ctx).Order("id").Limit(1).Find(&r)
		if res.Error != nil {
			return false, fmt.Errorf("read signing key: %w", res.Error)
		}
		if res.RowsAffected == 0 {
			return false, nil
		}
		k, err := box.Open(r.SealedKey, sealed.AD(owner, "signing_key/"+r.KID))
		if err != nil {
			return false, fmt.Errorf("open signing key %s (is GATEHOUSE_MASTER_KEY the one this data was created with?): %w", r.KID, err)
		}
		kid, key = r.KID, k
		return true, nil
	}
	if ok, err := load(); ok || err != nil {
		return kid, key, err
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return "", nil, err
	}
	newKID := RandomToken(9)
	sk, err := box.Seal(k, sealed.AD(owner, "signing_key/"+newKID))
	if err != nil {
		return "", nil, err
	}
	r := signingKeyRow{KID: newKID, SealedKey: sk, CreatedAt: time.Now().UTC()}
	if err := db.WithContext(ctx).Create(&r).Error; err != nil && !store.IsUniqueViolation(err) {
		return "", nil, fmt.Errorf("store signing key: %w", err)
	}
	// Another replica may have raced us: the first row wins for everyone,
	// whoever read it first (the newest would leave the first racer with
	// a key nobody else verifies with).
	if ok, err := load(); !ok || err != nil {
		return "", nil, fmt.Errorf("signing key missing after create: %v", err)
	}
	return kid, key, nil
}
