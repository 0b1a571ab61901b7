package recordings

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Opening is what review pages need of a command an audit event names:
// when it started (the replay's time base) and whether it is an
// interactive shell.
type Opening struct {
	StartedAt time.Time
	Shell     bool
}

// Openings reads the openings of the commands ids, by id; ids that name no
// command are left out. A command is an interactive shell when it ran on a
// TTY and its command line is shell exactly (the terminal's ShellCommand,
// which this package does not know), so an agent's exec of a similar
// script is not taken for one.
func Openings(ctx context.Context, db *gorm.DB, ids []int64, shell string) (map[int64]Opening, error) {
	out := make(map[int64]Opening, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	var rows []struct {
		ID        int64
		StartedAt time.Time
		Shell     int
	}
	err := db.WithContext(ctx).Model(&Command{}).
		Select("id, started_at, CASE WHEN tty = ? AND command = ? THEN 1 ELSE 0 END AS shell", true, shell).
		Where("id IN ?", ids).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("read the commands audit events name: %w", err)
	}
	for _, r := range rows {
		out[r.ID] = Opening{StartedAt: r.StartedAt.UTC(), Shell: r.Shell == 1}
	}
	return out, nil
}
