package recordings_test

import (
	"context"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestOpenings: a command is an interactive shell only when it ran on a
// TTY with the shell's command line exactly; each opening carries the
// command's start, and ids naming no command are left out.
func TestOpenings(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		db := storetest.Open(t, d, store.OrgSet)
		c := command(t, db, "me")
		const shell = "exec bash -i"
		for _, tc := range []struct {
			name    string
			command string
			tty     bool
			want    bool
		}{
			{"the shell on a TTY", shell, true, true},
			{"the shell without a TTY", shell, false, false},
			{"another command on a TTY", shell + " # not quite", true, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if err := db.Exec("UPDATE commands SET tty = ?, command = ? WHERE id = ?", tc.tty, tc.command, c.ID).Error; err != nil {
					t.Fatal(err)
				}
				got, err := recordings.Openings(ctx, db, []int64{c.ID, c.ID + 100}, shell)
				if err != nil {
					t.Fatal(err)
				}
				o, ok := got[c.ID]
				if !ok || len(got) != 1 {
					t.Fatalf("openings %v; want command %d only", got, c.ID)
				}
				if o.Shell != tc.want || o.StartedAt.Sub(c.StartedAt).Abs() > time.Millisecond {
					t.Fatalf("opening %+v; want shell %v, started %v", o, tc.want, c.StartedAt)
				}
			})
		}
	})
}
