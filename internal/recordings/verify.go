package recordings

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
)

// AuditCheck is the outcome of checking every recording the audit log
// vouches for.
type AuditCheck struct {
	OK bool `json:"ok"`
	// Checked counts the commands whose recordings matched.
	Checked int64 `json:"checked"`
	// RemovedByRetention counts the commands whose recordings an audited
	// retention run removed: they are skipped, not failed.
	RemovedByRetention int64 `json:"removed_by_retention,omitempty"`
	// FailedCommand and FailedSeq name the first command whose recording
	// does not match its end event, and that event.
	FailedCommand int64  `json:"failed_command,omitempty"`
	FailedSeq     int64  `json:"failed_seq,omitempty"`
	Problem       string `json:"problem,omitempty"`
}

// VerifyAll checks the recording of every command whose end event is in
// log against the chain heads and byte counts that event recorded. The
// audit chain itself is verified by audit.Log.Verify; together they prove
// the recordings untouched.
func VerifyAll(ctx context.Context, db *gorm.DB, log *audit.Log) (AuditCheck, error) {
	f, err := audit.ParseQuery("action:command.end")
	if err != nil {
		return AuditCheck{}, err
	}
	res := AuditCheck{OK: true}
	// A recording marked removed is skipped only if the command ended
	// before the cutoff of an audited retention run: a marker set by hand
	// on a newer command is a removal the chain does not vouch for.
	cutoff, err := retentionCutoff(ctx, log)
	if err != nil {
		return res, err
	}
	before := int64(0)
	for {
		evs, err := log.Query(ctx, f, before, audit.MaxPageSize)
		if err != nil {
			return res, fmt.Errorf("read command end events: %w", err)
		}
		for _, ev := range evs {
			if ev.Action != "command.end" {
				continue
			}
			var d struct {
				OutputHash  string `json:"output_hash"`
				InputHash   string `json:"input_hash"`
				OutputBytes int64  `json:"output_bytes"`
			}
			if err := json.Unmarshal(ev.Details, &d); err != nil {
				return res, fmt.Errorf("event %d: %w", ev.Seq, err)
			}
			id, err := strconv.ParseInt(ev.Target.ID, 10, 64)
			if err != nil {
				return res, fmt.Errorf("event %d names command %q", ev.Seq, ev.Target.ID)
			}
			removed, ended, err := removedAt(ctx, db, id)
			if err != nil {
				return res, err
			}
			if removed != nil {
				if ended == nil || !ended.Before(cutoff) {
					res.OK, res.FailedCommand, res.FailedSeq = false, id, ev.Seq
					res.Problem = "the recording was removed, but no audited retention run covers this command"
					return res, nil
				}
				res.RemovedByRetention++
				continue
			}
			v, err := Verify(ctx, db, id, d.OutputHash, d.InputHash)
			if err != nil {
				return res, err
			}
			if v.OK && v.OutBytes != d.OutputBytes {
				v.OK, v.Problem = false, "the output recording holds another number of bytes than its end event says"
			}
			if !v.OK {
				res.OK, res.FailedCommand, res.FailedSeq, res.Problem = false, id, ev.Seq, v.Problem
				return res, nil
			}
			res.Checked++
		}
		if len(evs) < audit.MaxPageSize {
			return res, nil
		}
		before = evs[len(evs)-1].Seq
	}
}

// VerifyOrg verifies an org's audit chain and then every recording its
// command end events vouch for, as one result: a changed recording breaks
// the chain at its command's end event.
func VerifyOrg(ctx context.Context, db *gorm.DB, log *audit.Log) (audit.VerifyResult, error) {
	res, err := log.Verify(ctx)
	if err != nil || !res.OK {
		return res, err
	}
	rc, err := VerifyAll(ctx, db, log)
	if err != nil {
		return res, fmt.Errorf("verify recordings: %w", err)
	}
	if !rc.OK {
		res.OK, res.BrokenAt = false, rc.FailedSeq
		res.Reason = fmt.Sprintf("the recording of command %d no longer matches: %s", rc.FailedCommand, rc.Problem)
	}
	return res, nil
}
