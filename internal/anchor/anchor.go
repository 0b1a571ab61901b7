// Package anchor keeps signed checkpoints of every org's audit chain head
// outside the org's database. The hash chain shows an edited or deleted
// event, but not the newest events cut off or an older copy of the
// database restored: what remains still links. A checkpoint — the head's
// sequence number and hash, signed with the org's own Ed25519 key — is
// stored in the catalog and recorded in the platform audit log; verifying
// the org's log against it names the events that went missing. Exported
// with its public key, a checkpoint can be kept elsewhere and checked
// offline (see Export).
package anchor

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Action is the platform audit action recording each checkpoint.
const Action = "audit.checkpoint"

// ExportAction records that someone exported a checkpoint (in the log of
// whoever asked: the org's for its auditors, the platform's for platform
// admins).
const ExportAction = "audit.checkpoint_export"

// checkpointTarget is the target type of an Action event; its ID is the
// org's slug and its details name the org's id.
const checkpointTarget = "organization"

// KeepPerOrg is how many checkpoints the catalog keeps per org; older
// ones are pruned as new ones are written (every one stays in the
// platform audit log). Verification needs only the newest; the ones
// before it bound where a restored copy diverged.
const KeepPerOrg = 1000

// Checkpoint is one signed record of an org's chain head.
type Checkpoint struct {
	OrgID   int64
	Org     string // the org's slug
	Seq     int64
	Hash    string
	TakenAt time.Time // whole seconds, UTC
	KeyID   string
	// PrevSeq is the sequence number of the org's checkpoint before this
	// one (0 for its first), signed with it; nil on checkpoints signed
	// before checkpoints named their predecessor (version 1).
	PrevSeq   *int64
	Signature []byte
}

// The first line of the text a signature covers names its version.
const (
	signedPrefixV1 = "gatehouse-audit-checkpoint-v1\n"
	signedPrefixV2 = "gatehouse-audit-checkpoint-v2\n"
)

// SignedText is the exact bytes the signature covers: a fixed first line
// and one "name: value" line per field, each ending in a newline,
// taken_at in RFC 3339 UTC whole seconds, and (version 2) prev_seq last.
// docs/operations.md shows how to rebuild it from an export with jq and
// check it with openssl.
func (c Checkpoint) SignedText() []byte {
	return signedText(c.Org, c.OrgID, c.Seq, c.Hash, c.TakenAt.UTC().Format(time.RFC3339), c.KeyID, c.PrevSeq)
}

func signedText(org string, orgID, seq int64, hash, takenAt, keyID string, prevSeq *int64) []byte {
	if prevSeq == nil {
		return fmt.Appendf(nil, "%sorg: %s\norg_id: %d\nseq: %d\nhash: %s\ntaken_at: %s\nkey_id: %s\n",
			signedPrefixV1, org, orgID, seq, hash, takenAt, keyID)
	}
	return fmt.Appendf(nil, "%sorg: %s\norg_id: %d\nseq: %d\nhash: %s\ntaken_at: %s\nkey_id: %s\nprev_seq: %d\n",
		signedPrefixV2, org, orgID, seq, hash, takenAt, keyID, *prevSeq)
}

// Anchor is the position the checkpoint holds the log to.
func (c Checkpoint) Anchor() audit.Anchor {
	return audit.Anchor{Seq: c.Seq, Hash: c.Hash, TakenAt: c.TakenAt}
}

// checkpointRow is the catalog's audit_anchors table.
type checkpointRow struct {
	ID        int64 `gorm:"primaryKey"`
	OrgID     int64 `gorm:"column:org_id"`
	Seq       int64
	Hash      string
	TakenAt   time.Time
	KeyID     string `gorm:"column:key_id"`
	PrevSeq   *int64 `gorm:"column:prev_seq"`
	Signature string // standard base64
}

func (checkpointRow) TableName() string { return "audit_anchors" }

func (r checkpointRow) checkpoint(slug string) Checkpoint {
	sig, _ := base64.StdEncoding.DecodeString(r.Signature)
	return Checkpoint{OrgID: r.OrgID, Org: slug, Seq: r.Seq, Hash: r.Hash, TakenAt: r.TakenAt.UTC(), KeyID: r.KeyID, PrevSeq: r.PrevSeq, Signature: sig}
}

// keyRow is the catalog's audit_anchor_keys table: an org's signing key,
// its seed sealed under the master key like the other signing keys.
type keyRow struct {
	ID        int64  `gorm:"primaryKey"`
	OrgID     int64  `gorm:"column:org_id"`
	KeyID     string `gorm:"column:key_id"`
	PublicKey string // standard base64 of the 32-byte key
	SealedKey string // the sealed 32-byte seed
	CreatedAt time.Time
}

func (keyRow) TableName() string { return "audit_anchor_keys" }

// Service writes, reads and checks checkpoints.
type Service struct {
	Catalog *gorm.DB
	Box     *sealed.Box
	// Audit is the platform audit log (on Catalog): every checkpoint is
	// recorded there too, in the same transaction.
	Audit *audit.Log
	Now   func() time.Time
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// ErrNone is returned when an org has no checkpoint yet.
var ErrNone = errors.New("no audit checkpoint yet")

// Latest is the org's newest checkpoint.
func (s *Service) Latest(ctx context.Context, org orgs.Org) (Checkpoint, error) {
	return s.latest(s.Catalog.WithContext(ctx), org)
}

func (s *Service) latest(db *gorm.DB, org orgs.Org) (Checkpoint, error) {
	var rows []checkpointRow
	if err := db.Where("org_id = ?", org.ID).Order("seq DESC").Limit(1).Find(&rows).Error; err != nil {
		return Checkpoint{}, fmt.Errorf("read audit checkpoint of %s: %w", org.Slug, err)
	}
	if len(rows) == 0 {
		return Checkpoint{}, ErrNone
	}
	return rows[0].checkpoint(org.Slug), nil
}

// Check compares the org's log with its checkpoints; ok is false when
// the org has none yet (nothing to compare with).
func (s *Service) Check(ctx context.Context, org orgs.Org, log *audit.Log) (ac audit.AnchorCheck, ok bool, err error) {
	var rows []checkpointRow
	if err := s.Catalog.WithContext(ctx).Select("seq, hash, taken_at").Where("org_id = ?", org.ID).Order("seq").Find(&rows).Error; err != nil {
		return ac, false, fmt.Errorf("read audit checkpoints of %s: %w", org.Slug, err)
	}
	if len(rows) == 0 {
		return ac, false, nil
	}
	anchors := make([]audit.Anchor, len(rows))
	for i, r := range rows {
		anchors[i] = audit.Anchor{Seq: r.Seq, Hash: r.Hash, TakenAt: r.TakenAt.UTC()}
	}
	ac, err = log.CheckAnchors(ctx, anchors)
	return ac, err == nil, err
}

// Verify folds the check of the org's checkpoints themselves (see
// CheckSignatures) and the comparison of its log with them into a
// verification of its chain.
func (s *Service) Verify(ctx context.Context, org orgs.Org, log *audit.Log, res audit.VerifyResult) (audit.VerifyResult, error) {
	cc, err := s.CheckSignatures(ctx, org)
	if err != nil {
		return res, err
	}
	if cc.Checked > 0 || !cc.OK {
		res = res.WithCheckpoints(cc)
	}
	ac, ok, err := s.Check(ctx, org, log)
	if err != nil || !ok {
		return res, err
	}
	return res.WithAnchor(ac), nil
}

// verifyOne checks cp's signature against the org's key it names (a key
// the console sealed, see publicKeys); the problem is nil when it
// verifies.
func (s *Service) verifyOne(db *gorm.DB, org orgs.Org, cp Checkpoint) (*audit.CheckpointProblem, error) {
	keys, err := s.publicKeys(db, org, cp.KeyID)
	if err != nil {
		return nil, err
	}
	if pub, ok := keys[cp.KeyID]; ok && ed25519.Verify(pub, cp.SignedText(), cp.Signature) {
		return nil, nil
	}
	return &audit.CheckpointProblem{FromSeq: cp.Seq, ThroughSeq: cp.Seq,
		Reason: fmt.Sprintf("the newest checkpoint, of event %d, does not verify with a key of the organization sealed by the console (it names %s): it was edited or not signed by the console", cp.Seq, cp.KeyID)}, nil
}

// Result says what Take did.
type Result struct {
	// Checkpoint is the org's newest checkpoint afterwards (zero when
	// the org has none: its log is empty).
	Checkpoint Checkpoint
	// Written is set when this call wrote Checkpoint.
	Written bool
	// Mismatch is set when the log no longer holds what the newest
	// checkpoint recorded: nothing is written (a checkpoint of the cut
	// or restored log would hide it) until the log is repaired.
	Mismatch *audit.AnchorCheck
	// Forged is set when the newest kept checkpoint's signature does not
	// verify, or the platform audit log records a newer checkpoint than
	// the newest kept (it was deleted): nothing is written until it is
	// repaired, since a checkpoint built on the one kept would hide it.
	Forged *audit.CheckpointProblem
}

// Take checkpoints the org's chain head when it moved past the newest
// checkpoint, and does nothing when it did not: an idle org costs three
// reads (the newest recorded checkpoint, the newest kept, the head). It
// builds only on a newest kept checkpoint that verifies and that is the
// newest the platform audit log recorded (see Result.Forged). The write
// holds a per-org lock (a Postgres advisory lock; SQLite's write lock),
// re-reads the newest checkpoint under it and never writes one at or
// below it, so replicas running the loop together write each head once,
// in order. The checkpoint and its platform audit record commit together.
func (s *Service) Take(ctx context.Context, org orgs.Org, log *audit.Log) (Result, error) {
	var res Result
	recorded, hasRecorded, err := s.newestRecorded(ctx, org)
	if err != nil {
		return res, err
	}
	prev, err := s.Latest(ctx, org)
	hasPrev := err == nil
	if err != nil && !errors.Is(err, ErrNone) {
		return res, err
	}
	if hasPrev {
		res.Checkpoint = prev
	}
	if res.Forged, err = s.newestProblem(s.Catalog.WithContext(ctx), org, prev, hasPrev, recorded, hasRecorded); err != nil || res.Forged != nil {
		return res, err
	}
	head, ok, err := s.headAgainst(ctx, log, prev, hasPrev, &res)
	if err != nil {
		return Result{}, err
	}
	if !ok {
		return s.explain(ctx, org, log, res)
	}
	err = s.Catalog.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := store.XactLock(tx, fmt.Sprintf("gatehouse-audit-anchor:%d", org.ID)); err != nil {
			return err
		}
		cur, err := s.latest(tx, org)
		switch {
		case errors.Is(err, ErrNone):
			cur = Checkpoint{}
		case err != nil:
			return err
		case cur.Seq >= head.Seq:
			res.Checkpoint = cur // another replica got there first
			return nil
		case !hasPrev || cur.Seq != prev.Seq:
			// A newer checkpoint came meanwhile: it must verify, and the
			// head must hold it too.
			if res.Forged, err = s.verifyOne(tx, org, cur); err != nil || res.Forged != nil {
				res.Checkpoint = cur
				return err
			}
			ac, err := log.CheckAnchors(ctx, []audit.Anchor{cur.Anchor()})
			if err != nil {
				return err
			}
			if !ac.OK {
				res.Checkpoint, res.Mismatch = cur, &ac
				return nil
			}
		}
		cp, err := s.write(ctx, tx, org, head, cur.Seq)
		if err != nil {
			return err
		}
		res.Checkpoint, res.Written = cp, true
		return nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("checkpoint the audit log of %s: %w", org.Slug, err)
	}
	return s.explain(ctx, org, log, res)
}

// explain replaces a mismatch found against the newest checkpoint with
// the comparison against all of them, which bounds where the log diverged.
func (s *Service) explain(ctx context.Context, org orgs.Org, log *audit.Log, res Result) (Result, error) {
	if res.Mismatch == nil {
		return res, nil
	}
	ac, ok, err := s.Check(ctx, org, log)
	if err != nil {
		return Result{}, err
	}
	if ok && !ac.OK {
		res.Mismatch = &ac
	}
	return res, nil
}

// headAgainst reads the head to checkpoint: ok is false when there is
// nothing to write (an empty log, a head that did not move, or a log that
// no longer holds the previous checkpoint, reported in res).
func (s *Service) headAgainst(ctx context.Context, log *audit.Log, prev Checkpoint, hasPrev bool, res *Result) (audit.Anchor, bool, error) {
	head, ok, err := log.Head(ctx)
	if err != nil || (!ok && !hasPrev) {
		return audit.Anchor{}, false, err
	}
	if !hasPrev {
		return audit.Anchor{Seq: head.Seq, Hash: head.Hash}, true, nil
	}
	res.Checkpoint = prev
	if ok && head.Seq == prev.Seq && head.Hash == prev.Hash {
		return audit.Anchor{}, false, nil // the head did not move
	}
	ac, err := log.CheckAnchors(ctx, []audit.Anchor{prev.Anchor()})
	if err != nil {
		return audit.Anchor{}, false, err
	}
	if !ac.OK {
		res.Mismatch = &ac
		return audit.Anchor{}, false, nil
	}
	if ac.HeadSeq <= prev.Seq {
		return audit.Anchor{}, false, nil
	}
	return audit.Anchor{Seq: ac.HeadSeq, Hash: ac.HeadHash}, true, nil
}

// write signs head, naming prevSeq (the newest checkpoint under the lock,
// 0 for none) before it, and stores it with its platform audit record.
func (s *Service) write(ctx context.Context, tx *gorm.DB, org orgs.Org, head audit.Anchor, prevSeq int64) (Checkpoint, error) {
	keyID, priv, err := s.signingKey(tx, org)
	if err != nil {
		return Checkpoint{}, err
	}
	cp := Checkpoint{OrgID: org.ID, Org: org.Slug, Seq: head.Seq, Hash: head.Hash,
		TakenAt: s.now().UTC().Truncate(time.Second), KeyID: keyID, PrevSeq: &prevSeq}
	cp.Signature = ed25519.Sign(priv, cp.SignedText())
	r := checkpointRow{OrgID: org.ID, Seq: cp.Seq, Hash: cp.Hash, TakenAt: cp.TakenAt, KeyID: cp.KeyID, PrevSeq: cp.PrevSeq,
		Signature: base64.StdEncoding.EncodeToString(cp.Signature)}
	if err := tx.Create(&r).Error; err != nil {
		return Checkpoint{}, fmt.Errorf("store audit checkpoint: %w", err)
	}
	var floor []int64
	if err := tx.Model(&checkpointRow{}).Where("org_id = ?", org.ID).Order("seq DESC").Offset(KeepPerOrg-1).Limit(1).Pluck("seq", &floor).Error; err != nil {
		return Checkpoint{}, fmt.Errorf("read old audit checkpoints: %w", err)
	}
	if len(floor) > 0 {
		if err := tx.Where("org_id = ? AND seq < ?", org.ID, floor[0]).Delete(&checkpointRow{}).Error; err != nil {
			return Checkpoint{}, fmt.Errorf("prune old audit checkpoints: %w", err)
		}
	}
	_, err = s.Audit.AppendTx(ctx, tx, audit.Event{
		Actor:  audit.Actor{Type: audit.ActorSystem, Name: "audit-checkpoint"},
		Action: Action,
		Target: audit.Target{Type: checkpointTarget, ID: org.Slug, Name: org.Name},
		Details: audit.Details(map[string]any{"org_id": org.ID, "seq": cp.Seq, "hash": cp.Hash,
			"taken_at": cp.TakenAt.Format(time.RFC3339), "key_id": cp.KeyID, "prev_seq": prevSeq, "signature": r.Signature}),
	})
	if err != nil {
		return Checkpoint{}, fmt.Errorf("record audit checkpoint: %w", err)
	}
	return cp, nil
}

// keyAD binds a sealed seed to its org and key id: a row copied to
// another org does not open.
func keyAD(org orgs.Org, keyID string) string {
	return sealed.AD("catalog", fmt.Sprintf("organization/%s/%d/audit_checkpoint_key/%s", org.Slug, org.ID, keyID))
}

// KeyID names a public key: the first 16 hex digits of its SHA-256.
func KeyID(pub ed25519.PublicKey) string { return Fingerprint(pub)[:16] }

// Fingerprint is the SHA-256 of a public key in hex, for pinning it.
func Fingerprint(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:])
}

// signingKey returns the org's newest checkpoint key, creating and
// sealing one on first use (inside the caller's locked transaction, so
// replicas do not race to create two).
func (s *Service) signingKey(tx *gorm.DB, org orgs.Org) (string, ed25519.PrivateKey, error) {
	var rows []keyRow
	if err := tx.Where("org_id = ?", org.ID).Order("id DESC").Limit(1).Find(&rows).Error; err != nil {
		return "", nil, fmt.Errorf("read audit checkpoint key: %w", err)
	}
	if len(rows) > 0 {
		k := rows[0]
		seed, err := s.Box.Open(k.SealedKey, keyAD(org, k.KeyID))
		if err != nil || len(seed) != ed25519.SeedSize {
			return "", nil, fmt.Errorf("open the audit checkpoint key %s of %s (is GATEHOUSE_MASTER_KEY the one this data was created with?): %w", k.KeyID, org.Slug, sealed.ErrOpen)
		}
		priv := ed25519.NewKeyFromSeed(seed)
		if base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)) != k.PublicKey {
			return "", nil, fmt.Errorf("the audit checkpoint key %s of %s does not match its public key", k.KeyID, org.Slug)
		}
		return k.KeyID, priv, nil
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", nil, fmt.Errorf("generate audit checkpoint key: %w", err)
	}
	k := keyRow{OrgID: org.ID, KeyID: KeyID(pub), PublicKey: base64.StdEncoding.EncodeToString(pub), CreatedAt: s.now().UTC()}
	if k.SealedKey, err = s.Box.Seal(priv.Seed(), keyAD(org, k.KeyID)); err != nil {
		return "", nil, err
	}
	if err := tx.Create(&k).Error; err != nil {
		return "", nil, fmt.Errorf("store audit checkpoint key: %w", err)
	}
	return k.KeyID, priv, nil
}
