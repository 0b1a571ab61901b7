package approvals

import (
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/recordings"
)

// CommandClaim is SetCommand as a claim of the exec's own commit
// (recordings.StartChecks.Claim): approved request id records the command
// being started, in the same transaction as the command's row, and only
// once: a request not approved, or one that already started a command,
// refuses the exec (409 approval_not_runnable) and nothing is written.
func CommandClaim(id int64) *recordings.Claim {
	return &recordings.Claim{
		SQL:     "UPDATE approvals SET command_id = ? WHERE id = ? AND state = 'approved' AND command_id IS NULL",
		Args:    []any{id},
		Refused: apperr.New(apperr.ErrConflict, CodeNotRunnable, "Approval %d is not approved, or its command already started: an approval runs its command once.", id),
	}
}

// CodeNotRunnable answers a start of an approval that cannot start
// (SetCommand, CommandClaim).
const CodeNotRunnable = "approval_not_runnable"
