package anchor

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/orgs"
)

// Format names the export's version: v2 for checkpoints that sign their
// predecessor's sequence number (prev_seq), v1 for those before.
const (
	Format   = "gatehouse-audit-checkpoint-v2"
	FormatV1 = "gatehouse-audit-checkpoint-v1"
)

// Algorithm is the signature algorithm of every checkpoint.
const Algorithm = "Ed25519"

// Export is a checkpoint as handed to an auditor: everything needed to
// check its signature offline. The signature covers Checkpoint.SignedText
// of the fields org, org_id, seq, hash, taken_at, key_id and (v2)
// prev_seq; public_key is
// a PEM "PUBLIC KEY" (SubjectPublicKeyInfo) that openssl reads, and
// public_key_sha256 the SHA-256 of the raw 32-byte key, to pin it. The
// key in the file only proves the file is self-consistent: compare its
// fingerprint with one kept from an earlier export.
type Export struct {
	Format          string `json:"format"`
	Org             string `json:"org"`
	OrgID           int64  `json:"org_id"`
	Seq             int64  `json:"seq"`
	Hash            string `json:"hash"`
	TakenAt         string `json:"taken_at"`
	KeyID           string `json:"key_id"`
	PrevSeq         *int64 `json:"prev_seq,omitempty"`
	Algorithm       string `json:"algorithm"`
	Signature       string `json:"signature"`
	PublicKey       string `json:"public_key"`
	PublicKeySHA256 string `json:"public_key_sha256"`
	// Warning, not signed, says that the org's log no longer holds what
	// this checkpoint recorded (so no newer one could be taken).
	Warning string `json:"warning,omitempty"`
}

// Export is the org's newest checkpoint with its public key (ErrNone
// when it has none yet). A newest checkpoint that Take would not build on
// is refused (apperr.ErrConflict), not handed out: one that does not
// verify with a key the console sealed would, with its forger's public
// key in the file, verify offline; an older one left when the newest was
// deleted would pass for the newest.
func (s *Service) Export(ctx context.Context, org orgs.Org) (Export, error) {
	recorded, hasRecorded, err := s.newestRecorded(ctx, org)
	if err != nil {
		return Export{}, err
	}
	cp, err := s.Latest(ctx, org)
	hasCp := err == nil
	if err != nil && (!errors.Is(err, ErrNone) || !hasRecorded) {
		return Export{}, err
	}
	db := s.Catalog.WithContext(ctx)
	p, err := s.newestProblem(db, org, cp, hasCp, recorded, hasRecorded)
	if err != nil {
		return Export{}, err
	}
	if p != nil {
		return Export{}, apperr.New(apperr.ErrConflict, "checkpoint_unverified",
			"The newest audit checkpoint of %q is not exported: %s. Run audit verify.", org.Slug, p.Reason)
	}
	keys, err := s.publicKeys(db, org, cp.KeyID)
	if err != nil {
		return Export{}, err
	}
	return NewExport(cp, keys[cp.KeyID])
}

// NewExport builds the export of cp signed by pub's key.
func NewExport(cp Checkpoint, pub ed25519.PublicKey) (Export, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return Export{}, fmt.Errorf("encode public key: %w", err)
	}
	format := Format
	if cp.PrevSeq == nil {
		format = FormatV1
	}
	return Export{
		Format: format, Org: cp.Org, OrgID: cp.OrgID, Seq: cp.Seq, Hash: cp.Hash, PrevSeq: cp.PrevSeq,
		TakenAt: cp.TakenAt.UTC().Format(time.RFC3339), KeyID: cp.KeyID, Algorithm: Algorithm,
		Signature:       base64.StdEncoding.EncodeToString(cp.Signature),
		PublicKey:       string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})),
		PublicKeySHA256: Fingerprint(pub),
	}, nil
}

// ReadExport decodes an exported checkpoint; unknown fields are refused.
func ReadExport(r io.Reader) (Export, error) {
	var e Export
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return Export{}, fmt.Errorf("not an audit checkpoint export: %w", err)
	}
	return e, nil
}

// Verify checks the export's signature with its own public key, and,
// when pin is set, that the key's SHA-256 fingerprint is pin. It needs
// nothing but the export. It returns the checkpoint's anchor.
func (e Export) Verify(pin string) (audit.Anchor, error) {
	if (e.Format != Format || e.PrevSeq == nil) && (e.Format != FormatV1 || e.PrevSeq != nil) || e.Algorithm != Algorithm {
		return audit.Anchor{}, fmt.Errorf("unsupported checkpoint format %q / algorithm %q (want %s with prev_seq or %s without, and %s)",
			e.Format, e.Algorithm, Format, FormatV1, Algorithm)
	}
	block, _ := pem.Decode([]byte(e.PublicKey))
	if block == nil || block.Type != "PUBLIC KEY" {
		return audit.Anchor{}, fmt.Errorf("the checkpoint's public_key is not a PEM public key")
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	pub, ok := k.(ed25519.PublicKey)
	if err != nil || !ok {
		return audit.Anchor{}, fmt.Errorf("the checkpoint's public_key is not an Ed25519 key")
	}
	fp := Fingerprint(pub)
	if fp != e.PublicKeySHA256 || KeyID(pub) != e.KeyID {
		return audit.Anchor{}, fmt.Errorf("the checkpoint's public_key_sha256 and key_id do not belong to its public_key")
	}
	if pin != "" && !strings.EqualFold(pin, fp) {
		return audit.Anchor{}, fmt.Errorf("the checkpoint is signed by key %s, not by the pinned key %s", fp, pin)
	}
	at, err := time.Parse(time.RFC3339, e.TakenAt)
	if err != nil {
		return audit.Anchor{}, fmt.Errorf("the checkpoint's taken_at is not an RFC 3339 time: %w", err)
	}
	sig, err := base64.StdEncoding.DecodeString(e.Signature)
	if err != nil {
		return audit.Anchor{}, fmt.Errorf("the checkpoint's signature is not base64: %w", err)
	}
	// The text is rebuilt from the fields as they stand in the file, as
	// an offline check with openssl does.
	if !ed25519.Verify(pub, signedText(e.Org, e.OrgID, e.Seq, e.Hash, e.TakenAt, e.KeyID, e.PrevSeq), sig) {
		return audit.Anchor{}, fmt.Errorf("the checkpoint's signature does not verify: it was altered or not signed by this key")
	}
	return audit.Anchor{Seq: e.Seq, Hash: e.Hash, TakenAt: at}, nil
}
