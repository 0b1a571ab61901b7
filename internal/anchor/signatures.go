package anchor

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/orgs"
)

// CheckSignatures checks the org's kept checkpoints themselves: each
// signature against the org's public key it names (an edited row or a
// replaced signature fails), each checkpoint's signed prev_seq against
// the one kept before it (a deleted checkpoint leaves a gap), and the
// newest against the newest checkpoint the platform audit log recorded
// (a deleted newest one). Checkpoints signed before prev_seq existed are
// checked by signature only. Whoever holds the master key can still sign
// new ones; an exported checkpoint kept elsewhere guards against that.
func (s *Service) CheckSignatures(ctx context.Context, org orgs.Org) (audit.CheckpointCheck, error) {
	recorded, hasRecorded, err := s.newestRecorded(ctx, org)
	if err != nil {
		return audit.CheckpointCheck{}, err
	}
	var rows []checkpointRow
	if err := s.Catalog.WithContext(ctx).Where("org_id = ?", org.ID).Order("seq").Find(&rows).Error; err != nil {
		return audit.CheckpointCheck{}, fmt.Errorf("read audit checkpoints of %s: %w", org.Slug, err)
	}
	keys, err := s.publicKeys(s.Catalog.WithContext(ctx), org, "")
	if err != nil {
		return audit.CheckpointCheck{}, err
	}
	cc := audit.CheckpointCheck{OK: true}
	problem := func(from, through int64, format string, args ...any) {
		cc.OK = false
		cc.Problems = append(cc.Problems, audit.CheckpointProblem{FromSeq: from, ThroughSeq: through, Reason: fmt.Sprintf(format, args...)})
	}
	for i, r := range rows {
		cp := r.checkpoint(org.Slug)
		cc.Checked++
		pub, ok := keys[cp.KeyID]
		switch {
		case !ok:
			problem(cp.Seq, cp.Seq, "the checkpoint of event %d names key %s, which is not a key of the organization sealed by the console", cp.Seq, cp.KeyID)
		case !ed25519.Verify(pub, cp.SignedText(), cp.Signature):
			problem(cp.Seq, cp.Seq, "the checkpoint of event %d does not verify with the organization's key %s: it was edited or not signed by the console", cp.Seq, cp.KeyID)
		}
		if cp.PrevSeq == nil {
			continue
		}
		switch {
		case i > 0 && *cp.PrevSeq != rows[i-1].Seq:
			problem(rows[i-1].Seq, cp.Seq, "checkpoints between those of events %d and %d were deleted: the checkpoint of event %d was signed after one of event %d",
				rows[i-1].Seq, cp.Seq, cp.Seq, *cp.PrevSeq)
		case i == 0 && *cp.PrevSeq != 0 && len(rows) < KeepPerOrg:
			problem(*cp.PrevSeq, cp.Seq, "checkpoints up to that of event %d were deleted: the oldest kept, of event %d, was signed after one of event %d",
				*cp.PrevSeq, cp.Seq, *cp.PrevSeq)
		}
	}
	var newest int64
	if len(rows) > 0 {
		newest = rows[len(rows)-1].Seq
	}
	if p := deletedNewest(newest, recorded, hasRecorded); p != nil {
		cc.OK = false
		cc.Problems = append(cc.Problems, *p)
	}
	return cc, nil
}

// deletedNewest is the problem of a newest kept checkpoint, of event
// newest (0 when none is kept), older than the newest the platform audit
// log recorded (ok false when it recorded none): the newer ones were
// deleted. The record must be read before the kept checkpoints: a
// checkpoint and its record commit together, so one committed in between
// is then among the kept, not taken for deleted.
func deletedNewest(newest, recorded int64, ok bool) *audit.CheckpointProblem {
	if !ok || recorded <= newest {
		return nil
	}
	return &audit.CheckpointProblem{FromSeq: newest + 1, ThroughSeq: recorded,
		Reason: fmt.Sprintf("the platform audit log records a checkpoint of event %d, newer than the newest kept (%d): it was deleted", recorded, newest)}
}

// newestProblem checks the org's newest kept checkpoint (hasCp false when
// none is kept) before anything builds on it or hands it out: it verifies
// with a key the console sealed, and the platform audit log records none
// newer (recorded and hasRecorded, read before cp; see deletedNewest).
// The problem is nil when it holds.
func (s *Service) newestProblem(db *gorm.DB, org orgs.Org, cp Checkpoint, hasCp bool, recorded int64, hasRecorded bool) (*audit.CheckpointProblem, error) {
	if !hasCp {
		return deletedNewest(0, recorded, hasRecorded), nil
	}
	if p, err := s.verifyOne(db, org, cp); err != nil || p != nil {
		return p, err
	}
	return deletedNewest(cp.Seq, recorded, hasRecorded), nil
}

// publicKeys are the org's checkpoint keys by key id (all of them when
// keyID is empty). A key counts only when its sealed seed opens under the
// master key, bound to the org and key id, and derives exactly the row's
// public key: anyone who can write the catalog can add a row with a public
// key of their own, but cannot seal its seed.
func (s *Service) publicKeys(db *gorm.DB, org orgs.Org, keyID string) (map[string]ed25519.PublicKey, error) {
	q := db.Select("key_id, public_key, sealed_key").Where("org_id = ?", org.ID)
	if keyID != "" {
		q = q.Where("key_id = ?", keyID)
	}
	var rows []keyRow
	if err := q.Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("read audit checkpoint keys of %s: %w", org.Slug, err)
	}
	keys := make(map[string]ed25519.PublicKey, len(rows))
	for _, r := range rows {
		if pub, ok := s.opens(org, r); ok {
			keys[r.KeyID] = pub
		}
	}
	return keys, nil
}

// opens is r's public key when r is a key the console made: its seed
// opens under the master key for org and r.KeyID and derives r's public
// key, which r.KeyID names.
func (s *Service) opens(org orgs.Org, r keyRow) (ed25519.PublicKey, bool) {
	raw, err := base64.StdEncoding.DecodeString(r.PublicKey)
	pub := ed25519.PublicKey(raw)
	if err != nil || len(pub) != ed25519.PublicKeySize || KeyID(pub) != r.KeyID {
		return nil, false
	}
	seed, err := s.Box.Open(r.SealedKey, keyAD(org, r.KeyID))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, false
	}
	if !pub.Equal(ed25519.NewKeyFromSeed(seed).Public()) {
		return nil, false
	}
	return pub, true
}

// newestRecorded is the event sequence number of the newest checkpoint
// the platform audit log recorded for org (ok false when it recorded
// none). It reads exactly the audit.checkpoint events of the org's target,
// newest first, and takes the first whose org_id is the org's and whose
// recorded signature verifies, with a key the console sealed, over what
// the record says was checkpointed. An earlier org that had the slug is
// passed over, however many records it has; so is a record anyone could
// have appended (the platform log is an unkeyed chain): only a checkpoint
// this console signed can say a newer one was deleted.
func (s *Service) newestRecorded(ctx context.Context, org orgs.Org) (int64, bool, error) {
	if s.Audit == nil {
		return 0, false, nil
	}
	keys, err := s.publicKeys(s.Catalog.WithContext(ctx), org, "")
	if err != nil {
		return 0, false, err
	}
	const page = 100
	var before int64
	for {
		evs, err := s.Audit.Recorded(ctx, Action, checkpointTarget, org.Slug, before, page)
		if err != nil {
			return 0, false, fmt.Errorf("read recorded audit checkpoints of %s: %w", org.Slug, err)
		}
		for _, e := range evs {
			if seq, ok := signedRecord(e.Details, org, keys); ok {
				return seq, true, nil
			}
		}
		if len(evs) < page {
			return 0, false, nil
		}
		before = evs[len(evs)-1].Seq
	}
}

// signedRecord is the seq of a platform record of one of org's
// checkpoints, when the record's signature verifies with one of keys.
func signedRecord(details []byte, org orgs.Org, keys map[string]ed25519.PublicKey) (int64, bool) {
	var d struct {
		OrgID     int64  `json:"org_id"`
		Seq       int64  `json:"seq"`
		Hash      string `json:"hash"`
		TakenAt   string `json:"taken_at"`
		KeyID     string `json:"key_id"`
		PrevSeq   *int64 `json:"prev_seq"`
		Signature string `json:"signature"`
	}
	if json.Unmarshal(details, &d) != nil || d.OrgID != org.ID {
		return 0, false
	}
	pub, ok := keys[d.KeyID]
	sig, err := base64.StdEncoding.DecodeString(d.Signature)
	if !ok || err != nil || !ed25519.Verify(pub, signedText(org.Slug, org.ID, d.Seq, d.Hash, d.TakenAt, d.KeyID, d.PrevSeq), sig) {
		return 0, false
	}
	return d.Seq, true
}
