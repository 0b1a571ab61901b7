package anchor_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/anchor"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// threeCheckpoints gives the org checkpoints of events 2, 4 and 6.
func threeCheckpoints(t *testing.T, f *fixture) {
	t.Helper()
	for range 3 {
		f.append(t, 2)
		if res := f.take(t); !res.Written {
			t.Fatalf("take: %+v", res)
		}
	}
}

// Verify checks the checkpoints themselves: an edited row, a replaced
// signature, a deleted one in the middle and a deleted newest one each
// fail verification, named with the checkpoints' range, although the
// chain links and holds what is left.
func TestVerifyChecksCheckpointSignatures(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		for _, tc := range []struct {
			name          string
			tamper        func(t *testing.T, f *fixture)
			from, through int64
			reason        string
		}{
			{"an edited hash", func(t *testing.T, f *fixture) {
				f.exec(t, "UPDATE audit_anchors SET hash = ? WHERE org_id = ? AND seq = 4", strings.Repeat("0", 64), f.org.ID)
			}, 4, 4, "checkpoint of event 4 does not verify"},
			{"a replaced signature", func(t *testing.T, f *fixture) {
				f.exec(t, "UPDATE audit_anchors SET signature = ? WHERE org_id = ? AND seq = 6", base64.StdEncoding.EncodeToString(make([]byte, 64)), f.org.ID)
			}, 6, 6, "checkpoint of event 6 does not verify"},
			{"a deleted checkpoint between two", func(t *testing.T, f *fixture) {
				f.exec(t, "DELETE FROM audit_anchors WHERE org_id = ? AND seq = 4", f.org.ID)
			}, 2, 6, "between those of events 2 and 6 were deleted"},
			{"the oldest deleted", func(t *testing.T, f *fixture) {
				f.exec(t, "DELETE FROM audit_anchors WHERE org_id = ? AND seq = 2", f.org.ID)
			}, 2, 4, "up to that of event 2 were deleted"},
			{"an edited row re-signed with a key inserted in the catalog", func(t *testing.T, f *fixture) {
				forgeWithInsertedKey(t, f, 4, 2)
			}, 4, 4, "checkpoint of event 4 names key"},
			{"the newest deleted", func(t *testing.T, f *fixture) {
				f.exec(t, "DELETE FROM audit_anchors WHERE org_id = ? AND seq = 6", f.org.ID)
			}, 5, 6, "records a checkpoint of event 6, newer than the newest kept (4)"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newFixture(t, d)
				threeCheckpoints(t, f)
				if res := f.verify(t); !res.OK || res.Checkpoints == nil || !res.Checkpoints.OK || res.Checkpoints.Checked != 3 {
					t.Fatalf("before tampering: %+v %+v", res, res.Checkpoints)
				}
				tc.tamper(t, f)
				res := f.verify(t)
				if res.OK || res.Checkpoints == nil || res.Checkpoints.OK {
					t.Fatalf("after tampering verification passed: %+v", res)
				}
				found := false
				for _, p := range res.Checkpoints.Problems {
					if p.FromSeq == tc.from && p.ThroughSeq == tc.through && strings.Contains(p.Reason, tc.reason) {
						found = true
					}
				}
				if !found {
					t.Errorf("problems %+v, want %d–%d %q", res.Checkpoints.Problems, tc.from, tc.through, tc.reason)
				}
				if !strings.Contains(res.Reason, tc.reason) {
					t.Errorf("reason %q does not say %q", res.Reason, tc.reason)
				}
			})
		}
	})
}

// The loop does not build on a newest checkpoint that does not verify:
// it writes none, counts the mismatch and records it in the platform log
// once, however many rounds find it.
func TestRoundReportsForgedCheckpoint(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newFixture(t, d)
		threeCheckpoints(t, f)
		f.exec(t, "UPDATE audit_anchors SET hash = ? WHERE org_id = ? AND seq = 6", strings.Repeat("0", 64), f.org.ID)
		f.append(t, 2)
		var kinds []string
		r := &anchor.Runner{Anchors: f.svc,
			ListOrgs: func(context.Context) ([]string, error) { return []string{"acme"}, nil },
			OpenOrg: func(context.Context, string) (anchor.OrgDeps, error) {
				return anchor.OrgDeps{Org: f.org, Audit: f.log, Release: func() {}}, nil
			},
			Mismatch: func(org, kind string) { kinds = append(kinds, org+"/"+kind) },
		}
		for range 2 {
			if st := r.Round(context.Background()); st.Mismatched != 1 || st.Written != 0 {
				t.Fatalf("round: %+v", st)
			}
		}
		if strings.Join(kinds, ",") != "acme/checkpoint,acme/checkpoint" {
			t.Errorf("mismatches told %v", kinds)
		}
		if rows, _ := f.counts(t); rows != 3 {
			t.Errorf("%d checkpoints after the rounds, want no new one on a forged newest", rows)
		}
		evs, err := f.platform.Query(context.Background(), audit.Filter{Action: anchor.MismatchAction}, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 1 || evs[0].Target.ID != "acme" || !strings.Contains(string(evs[0].Details), "does not verify") {
			t.Errorf("platform log has %d mismatch events (%+v), want one naming the forged checkpoint", len(evs), evs)
		}
	})
}

// A mismatch of the log with its checkpoint found by the loop is counted
// and recorded in the platform log too, not only logged.
func TestRoundReportsLogMismatch(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newFixture(t, d)
		threeCheckpoints(t, f)
		f.cut(t, 4)
		var kinds []string
		r := &anchor.Runner{Anchors: f.svc,
			ListOrgs: func(context.Context) ([]string, error) { return []string{"acme"}, nil },
			OpenOrg: func(context.Context, string) (anchor.OrgDeps, error) {
				return anchor.OrgDeps{Org: f.org, Audit: f.log, Release: func() {}}, nil
			},
			Mismatch: func(org, kind string) { kinds = append(kinds, org+"/"+kind) },
		}
		if st := r.Round(context.Background()); st.Mismatched != 1 {
			t.Fatalf("round: %+v", st)
		}
		if strings.Join(kinds, ",") != "acme/log" {
			t.Errorf("mismatches told %v", kinds)
		}
		evs, err := f.platform.Query(context.Background(), audit.Filter{Action: anchor.MismatchAction}, 0, 10)
		if err != nil || len(evs) != 1 || !strings.Contains(string(evs[0].Details), "missing") {
			t.Fatalf("platform mismatch events %+v, %v", evs, err)
		}
	})
}

// forgeWithInsertedKey does what a catalog writer without the master key
// can: add a key row of their own (a low id, so the console keeps signing
// with its key; a seed that was never sealed) and re-sign the checkpoint
// of event seq, its hash edited, with it.
func forgeWithInsertedKey(t *testing.T, f *fixture, seq, prevSeq int64) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kid := anchor.KeyID(pub)
	f.exec(t, "INSERT INTO audit_anchor_keys (id, org_id, key_id, public_key, sealed_key, created_at) VALUES (-5, ?, ?, ?, 'v1:forged', ?)",
		f.org.ID, kid, base64.StdEncoding.EncodeToString(pub), time.Now().UTC())
	var takenAt time.Time
	if err := f.catalog.Raw("SELECT taken_at FROM audit_anchors WHERE org_id = ? AND seq = ?", f.org.ID, seq).Scan(&takenAt).Error; err != nil {
		t.Fatal(err)
	}
	cp := anchor.Checkpoint{OrgID: f.org.ID, Org: f.org.Slug, Seq: seq, Hash: strings.Repeat("0", 64), TakenAt: takenAt.UTC(), KeyID: kid, PrevSeq: &prevSeq}
	cp.Signature = ed25519.Sign(priv, cp.SignedText())
	f.exec(t, "UPDATE audit_anchors SET hash = ?, key_id = ?, signature = ? WHERE org_id = ? AND seq = ?",
		cp.Hash, kid, base64.StdEncoding.EncodeToString(cp.Signature), f.org.ID, seq)
}

// A key row the console did not seal is no key of the org: the newest
// checkpoint re-signed with one fails verification, the loop builds on it
// no newer checkpoint, and it is not exported (with the forger's public key
// in the file it would verify offline).
func TestInsertedKeyIsNotTrusted(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		f := newFixture(t, d)
		threeCheckpoints(t, f)
		forgeWithInsertedKey(t, f, 6, 4)
		t.Run("verify", func(t *testing.T) {
			res := f.verify(t)
			if res.OK || res.Checkpoints == nil || res.Checkpoints.OK || len(res.Checkpoints.Problems) == 0 ||
				res.Checkpoints.Problems[0].FromSeq != 6 || !strings.Contains(res.Checkpoints.Problems[0].Reason, "checkpoint of event 6 names key") {
				t.Fatalf("verify passed a checkpoint signed with an inserted key: %+v %+v", res, res.Checkpoints)
			}
		})
		t.Run("take", func(t *testing.T) {
			f.append(t, 2)
			res := f.take(t)
			if res.Written || res.Forged == nil || res.Forged.FromSeq != 6 {
				t.Fatalf("take built on a checkpoint signed with an inserted key: %+v", res)
			}
		})
		t.Run("export", func(t *testing.T) {
			exp, err := f.svc.Export(ctx, f.org)
			if !errors.Is(err, apperr.ErrConflict) || !strings.Contains(err.Error(), "event 6") {
				t.Fatalf("export of a checkpoint signed with an inserted key: %+v %v", exp, err)
			}
		})
	})
}

// A newest checkpoint deleted with the events it recorded is not laundered
// by the next checkpoint: while the platform log records a newer one than
// the newest kept, Take writes nothing and reports it like a forgery, the
// loop records the mismatch, verify keeps failing and export refuses. With
// every checkpoint deleted the same holds.
func TestTakeDoesNotLaunderDeletedNewest(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		for _, tc := range []struct {
			name   string
			delete string
			kept   int64 // the newest checkpoint left
		}{
			{"the newest", "seq = 9", 6},
			{"all", "seq > 0", 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx := context.Background()
				f := newFixture(t, d)
				threeCheckpoints(t, f) // 2, 4, 6
				f.append(t, 3)
				if res := f.take(t); !res.Written || res.Checkpoint.Seq != 9 {
					t.Fatalf("take: %+v", res)
				}
				f.cut(t, tc.kept+1)
				f.exec(t, "DELETE FROM audit_anchors WHERE org_id = ? AND "+tc.delete, f.org.ID)
				f.append(t, 1) // the head moved past the newest kept
				rows, _ := f.counts(t)
				res := f.take(t)
				if res.Written || res.Forged == nil || res.Forged.FromSeq != tc.kept+1 || res.Forged.ThroughSeq != 9 ||
					!strings.Contains(res.Forged.Reason, "records a checkpoint of event 9") {
					t.Fatalf("take after the newest checkpoint was deleted: %+v %+v", res, res.Forged)
				}
				var kinds []string
				r := &anchor.Runner{Anchors: f.svc,
					ListOrgs: func(context.Context) ([]string, error) { return []string{"acme"}, nil },
					OpenOrg: func(context.Context, string) (anchor.OrgDeps, error) {
						return anchor.OrgDeps{Org: f.org, Audit: f.log, Release: func() {}}, nil
					},
					Mismatch: func(org, kind string) { kinds = append(kinds, org+"/"+kind) },
				}
				if st := r.Round(ctx); st.Mismatched != 1 || st.Written != 0 || strings.Join(kinds, ",") != "acme/checkpoint" {
					t.Fatalf("round: %+v, told %v", st, kinds)
				}
				if after, _ := f.counts(t); after != rows {
					t.Fatalf("%d checkpoints after take and a round, want %d: one was written over the deleted newest", after, rows)
				}
				evs, err := f.platform.Query(ctx, audit.Filter{Action: anchor.MismatchAction}, 0, 10)
				if err != nil || len(evs) != 1 || !strings.Contains(string(evs[0].Details), "records a checkpoint of event 9") {
					t.Fatalf("platform mismatch events %+v, %v", evs, err)
				}
				if v := f.verify(t); v.OK || v.Checkpoints == nil || v.Checkpoints.OK {
					t.Fatalf("verify passed after the newest checkpoint was deleted: %+v", v)
				}
				if exp, err := f.svc.Export(ctx, f.org); !errors.Is(err, apperr.ErrConflict) || !strings.Contains(err.Error(), "event 9") {
					t.Fatalf("export after the newest checkpoint was deleted: %+v %v", exp, err)
				}
			})
		}
	})
}

// The newest recorded checkpoint is found however many look-alike platform
// events came after it: exports of the org's checkpoint and checkpoints of
// another org whose display name is this org's slug. A deleted newest
// checkpoint still fails verification and stops Take.
func TestNewestRecordedIsNotCrowdedOut(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		f := newFixture(t, d)
		threeCheckpoints(t, f) // 2, 4, 6
		other := addOrg(t, f.catalog, "globex")
		other.Name = f.org.Slug
		otherLog := audit.NewLog(storetest.Open(t, d, store.OrgSet), audit.OrgTable, nil)
		for range 5 {
			if _, err := otherLog.Append(ctx, audit.Event{Actor: audit.Actor{Type: audit.ActorSystem}, Action: "thing.do"}); err != nil {
				t.Fatal(err)
			}
			if res, err := f.svc.Take(ctx, other, otherLog); err != nil || !res.Written {
				t.Fatalf("take of %s: %+v %v", other.Slug, res, err)
			}
		}
		for range 60 {
			if _, err := f.platform.Append(ctx, audit.Event{Actor: audit.Actor{Type: audit.ActorUser, ID: "1", Name: "admin"}, Action: anchor.ExportAction,
				Target: audit.Target{Type: "organization", ID: f.org.Slug, Name: f.org.Name}}); err != nil {
				t.Fatal(err)
			}
		}
		f.exec(t, "DELETE FROM audit_anchors WHERE org_id = ? AND seq = 6", f.org.ID)
		if v := f.verify(t); v.OK || v.Checkpoints == nil || !strings.Contains(v.Reason, "records a checkpoint of event 6, newer than the newest kept (4)") {
			t.Fatalf("verify after the newest checkpoint was deleted behind 60 exports: %+v", v)
		}
		f.append(t, 1)
		if res := f.take(t); res.Written || res.Forged == nil || res.Forged.ThroughSeq != 6 {
			t.Fatalf("take after the newest checkpoint was deleted behind 60 exports: %+v", res)
		}
	})
}

func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if err := f.catalog.Exec(sql, args...).Error; err != nil {
		t.Fatal(err)
	}
}

// Exports of both versions verify offline; one whose prev_seq was added,
// removed or changed does not.
func TestExportVersions(t *testing.T) {
	t.Parallel()
	pub, priv, _ := ed25519.GenerateKey(nil)
	prev := int64(7)
	for _, prevSeq := range []*int64{nil, &prev} {
		cp := anchor.Checkpoint{OrgID: 1, Org: "acme", Seq: 9, Hash: strings.Repeat("a", 64), TakenAt: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC),
			KeyID: anchor.KeyID(pub), PrevSeq: prevSeq}
		cp.Signature = ed25519.Sign(priv, cp.SignedText())
		exp, err := anchor.NewExport(cp, pub)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := exp.Verify(exp.PublicKeySHA256); err != nil {
			t.Errorf("%s export: %v", exp.Format, err)
		}
		other := int64(6)
		for name, edit := range map[string]func(*anchor.Export){
			"prev_seq changed": func(e *anchor.Export) { e.PrevSeq = &other },
			"prev_seq removed": func(e *anchor.Export) { e.PrevSeq = nil },
		} {
			e := exp
			edit(&e)
			if e.PrevSeq == exp.PrevSeq {
				continue
			}
			if _, err := e.Verify(""); err == nil {
				t.Errorf("%s export with %s verified", exp.Format, name)
			}
		}
	}
}

// A platform record of a checkpoint counts only when its signature
// verifies with a key the console sealed: anyone who can append to the
// platform log (an unkeyed chain) could otherwise record a checkpoint of
// an event far ahead and stop every later checkpoint and export of the
// org for good, blaming a deletion.
func TestForgedPlatformRecordStopsNothing(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		f := newFixture(t, d)
		threeCheckpoints(t, f) // 2, 4, 6
		var keyID string
		if err := f.catalog.Raw("SELECT key_id FROM audit_anchor_keys WHERE org_id = ?", f.org.ID).Scan(&keyID).Error; err != nil {
			t.Fatal(err)
		}
		if _, err := f.platform.Append(ctx, audit.Event{Actor: audit.Actor{Type: audit.ActorSystem, Name: "audit-checkpoint"}, Action: anchor.Action,
			Target: audit.Target{Type: "organization", ID: f.org.Slug, Name: f.org.Name},
			Details: audit.Details(map[string]any{"org_id": f.org.ID, "seq": int64(1) << 40, "hash": strings.Repeat("f", 64),
				"taken_at": "2026-05-01T12:00:00Z", "key_id": keyID, "prev_seq": 6, "signature": base64.StdEncoding.EncodeToString(make([]byte, 64))})}); err != nil {
			t.Fatal(err)
		}
		if v := f.verify(t); !v.OK {
			t.Fatalf("verify after a forged platform record: %+v %+v", v, v.Checkpoints)
		}
		f.append(t, 1)
		if res := f.take(t); !res.Written || res.Forged != nil {
			t.Fatalf("take after a forged platform record: %+v %+v", res, res.Forged)
		}
		if _, err := f.svc.Export(ctx, f.org); err != nil {
			t.Fatalf("export after a forged platform record: %v", err)
		}
	})
}
