package recordings

import (
	"context"
	"fmt"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// settingStdin is the org setting (org_settings) that says whether stdin
// content is recorded ("true", the default) or only its size ("false").
const settingStdin = "recordings.stdin_content"

type orgSetting struct {
	Key   string `gorm:"primaryKey"`
	Value string
}

func (orgSetting) TableName() string { return "org_settings" }

// StdinContent reports whether the org records what is typed into
// commands, or only how much.
func StdinContent(ctx context.Context, db *gorm.DB) (bool, error) {
	var s []orgSetting
	if err := db.WithContext(ctx).Where("key = ?", settingStdin).Limit(1).Find(&s).Error; err != nil {
		return false, fmt.Errorf("read recording settings: %w", err)
	}
	return len(s) == 0 || s[0].Value != "false", nil
}

// SetStdinContent changes the setting inside the caller's transaction (with
// its audit record). Commands already running keep the setting they
// started with.
func SetStdinContent(ctx context.Context, tx *gorm.DB, on bool) error {
	v := "false"
	if on {
		v = "true"
	}
	return tx.WithContext(ctx).Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "key"}}, DoUpdates: clause.AssignmentColumns([]string{"value"})}).
		Create(&orgSetting{Key: settingStdin, Value: v}).Error
}
