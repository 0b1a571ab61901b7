package recordings

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
)

// RetentionAction is the audit action of an applied retention policy; its
// details carry recordings_cutoff, the end time before which recordings
// may have been removed (VerifyAll trusts a removal marker only before it).
const RetentionAction = "retention.apply"

// expireBatch bounds the commands whose recordings one transaction removes.
const expireBatch = 500

// ExpireRecordings removes the recordings (frames and search text) of
// commands that ended before cutoff. The command rows stay: who ran what,
// when, with which exit code and how many bytes, and the audit events that
// name them still resolve; recording_removed_at marks them so verification
// knows the recording is gone by policy rather than by tampering. Running
// commands are never touched.
func ExpireRecordings(ctx context.Context, db *gorm.DB, cutoff, now time.Time) (int64, error) {
	var total int64
	for {
		var ids []int64
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Table("commands").Where("state <> ? AND ended_at IS NOT NULL AND ended_at < ? AND recording_removed_at IS NULL",
				StateRunning, cutoff.UTC()).Order("id").Limit(expireBatch).Pluck("id", &ids).Error; err != nil {
				return fmt.Errorf("find expired recordings: %w", err)
			}
			if len(ids) == 0 {
				return nil
			}
			if err := tx.Exec("DELETE FROM recording_frames WHERE command_id IN ?", ids).Error; err != nil {
				return fmt.Errorf("remove recording frames: %w", err)
			}
			if err := tx.Exec("DELETE FROM recording_text WHERE command_id IN ?", ids).Error; err != nil {
				return fmt.Errorf("remove recording text: %w", err)
			}
			if err := tx.Exec("UPDATE commands SET recording_removed_at = ? WHERE id IN ?", now.UTC(), ids).Error; err != nil {
				return fmt.Errorf("mark removed recordings: %w", err)
			}
			return nil
		})
		if err != nil {
			return total, err
		}
		total += int64(len(ids))
		if len(ids) < expireBatch {
			return total, nil
		}
	}
}

// retentionCutoff is the newest recordings cutoff an audited retention
// run applied (zero if none).
func retentionCutoff(ctx context.Context, log *audit.Log) (time.Time, error) {
	f, err := audit.ParseQuery("action:" + RetentionAction)
	if err != nil {
		return time.Time{}, err
	}
	evs, err := log.Query(ctx, f, 0, 20)
	if err != nil {
		return time.Time{}, fmt.Errorf("read retention events: %w", err)
	}
	var latest time.Time
	for _, ev := range evs {
		if ev.Action != RetentionAction {
			continue
		}
		var d struct {
			RecordingsCutoff *time.Time `json:"recordings_cutoff"`
		}
		if json.Unmarshal(ev.Details, &d) == nil && d.RecordingsCutoff != nil && d.RecordingsCutoff.After(latest) {
			latest = *d.RecordingsCutoff
		}
	}
	return latest, nil
}

// removedAt reads a command's retention marker.
func removedAt(ctx context.Context, db *gorm.DB, id int64) (*time.Time, *time.Time, error) {
	var rows []struct {
		RecordingRemovedAt *time.Time
		EndedAt            *time.Time
	}
	if err := db.WithContext(ctx).Table("commands").Select("recording_removed_at, ended_at").Where("id = ?", id).Limit(1).Find(&rows).Error; err != nil {
		return nil, nil, fmt.Errorf("read command %d: %w", id, err)
	}
	if len(rows) == 0 {
		return nil, nil, nil
	}
	return rows[0].RecordingRemovedAt, rows[0].EndedAt, nil
}
