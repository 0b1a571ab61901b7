package handlers_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/gatehouse/gatehouse/internal/anchor"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// The org's audit chain head is checkpointed at every verify and export;
// an auditor and a platform admin export the signed checkpoint, which
// verifies offline; deleting the newest events makes verify fail naming
// them; deleting the org deletes its checkpoints.
func TestAuditCheckpointOverHTTP(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		e := newEnv(t, d)
		platform := e.adminToken()
		e.createOrg(platform, "acme", "Acme")
		root := e.enterOrg(platform, "acme")
		uid, auditor := e.newOrgUser(root, "acme", "auditor@acme.test")
		wantStatus(t, "auditor role", e.json(http.MethodPost, "/api/v1/orgs/acme/roles", root,
			rbac.Assignment{Subject: fmt.Sprintf("user:%d", uid), Role: rbac.RoleAuditor, Domain: rbac.DomainOrg}), http.StatusNoContent)
		org, err := e.c.Orgs.Get(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		ten, err := e.c.Tenants.Open(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		release := sync.OnceFunc(ten.Release)
		t.Cleanup(release)
		head := func() audit.Event {
			t.Helper()
			h, ok, err := ten.Audit.Head(ctx)
			if err != nil || !ok {
				t.Fatalf("head: %v", err)
			}
			return h
		}
		verify := func(tok string) audit.VerifyResult {
			t.Helper()
			r := e.json(http.MethodPost, "/api/v1/orgs/acme/audit/verify", tok, nil)
			wantStatus(t, "verify", r, http.StatusOK)
			var v audit.VerifyResult
			r.decode(t, &v)
			return v
		}

		t.Run("verify checkpoints the head", func(t *testing.T) {
			if v := verify(auditor); !v.OK {
				t.Fatalf("first verify: %+v", v)
			}
			cp, err := e.c.Anchors.Latest(ctx, org)
			if err != nil || cp.Seq != head().Seq || cp.Hash != head().Hash {
				t.Fatalf("checkpoint %+v (%v), head %d", cp, err, head().Seq)
			}
			v := verify(auditor)
			if !v.OK || v.Anchor == nil || !v.Anchor.OK || v.Anchor.Anchor.Seq != cp.Seq {
				t.Fatalf("second verify, against the checkpoint: %+v %+v", v, v.Anchor)
			}
		})

		t.Run("an export of a search that leaves events out is named and labelled filtered", func(t *testing.T) {
			r := e.do(request{method: http.MethodGet, path: "/api/v1/orgs/acme/audit/export?format=jsonl&q=" + url.QueryEscape("action:user."), token: auditor})
			wantStatus(t, "filtered export", r, http.StatusOK)
			if cd := r.header.Get("Content-Disposition"); !strings.Contains(cd, "-filtered.jsonl") ||
				!bytes.HasPrefix(r.body, []byte(`{"#export":{"filtered":true,"query":"action:user."`)) {
				t.Fatalf("Content-Disposition %q, body starts %.120q", cd, r.body)
			}
			r = e.do(request{method: http.MethodGet, path: "/api/v1/orgs/acme/audit/export?format=jsonl", token: auditor})
			if cd := r.header.Get("Content-Disposition"); strings.Contains(cd, "filtered") || bytes.HasPrefix(r.body, []byte(`{"#export"`)) {
				t.Fatalf("the unfiltered export is labelled filtered: %q", cd)
			}
		})

		var exported anchor.Export
		t.Run("auditor exports the checkpoint", func(t *testing.T) {
			r := e.do(request{method: http.MethodGet, path: "/api/v1/orgs/acme/audit/checkpoint", token: auditor})
			wantStatus(t, "export checkpoint", r, http.StatusOK)
			if !strings.Contains(r.header.Get("Content-Disposition"), "audit-checkpoint-acme-") {
				t.Errorf("Content-Disposition %q", r.header.Get("Content-Disposition"))
			}
			exp, err := anchor.ReadExport(bytes.NewReader(r.body))
			if err != nil {
				t.Fatal(err)
			}
			a, err := exp.Verify("")
			// The export was audited first, so the checkpoint covers it.
			if h := head(); err != nil || a.Seq != h.Seq || a.Hash != h.Hash || h.Action != anchor.ExportAction || exp.Warning != "" {
				t.Fatalf("exported checkpoint %+v (%v); head %d %s", exp, err, h.Seq, h.Action)
			}
			exported = exp
		})

		t.Run("platform admin exports it without entering", func(t *testing.T) {
			r := e.do(request{method: http.MethodGet, path: "/api/v1/audit/checkpoints/acme", token: platform})
			wantStatus(t, "platform export", r, http.StatusOK)
			exp, err := anchor.ReadExport(bytes.NewReader(r.body))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := exp.Verify(exported.PublicKeySHA256); err != nil || exp.Seq < exported.Seq {
				t.Fatalf("platform export %+v: %v", exp, err)
			}
			evs, err := e.c.Audit.Query(ctx, audit.Filter{Action: anchor.ExportAction}, 0, 5)
			if err != nil || len(evs) != 1 || evs[0].Target.ID != "acme" {
				t.Fatalf("platform record of the export: %+v %v", evs, err)
			}
			wantStatus(t, "unknown org", e.do(request{method: http.MethodGet, path: "/api/v1/audit/checkpoints/nosuch", token: platform}), http.StatusNotFound)
		})

		t.Run("deleting the newest events fails verify", func(t *testing.T) {
			// An export (audited) checkpoints the head; then the newest
			// three events go, straight in the org's database.
			wantStatus(t, "export", e.do(request{method: http.MethodGet, path: "/api/v1/orgs/acme/audit/export?format=jsonl", token: auditor}), http.StatusOK)
			h := head()
			cp, err := e.c.Anchors.Latest(ctx, org)
			if err != nil || cp.Seq != h.Seq {
				t.Fatalf("the export did not checkpoint the head: %+v %v, head %d", cp, err, h.Seq)
			}
			if err := ten.DB.Exec("DELETE FROM audit_events WHERE seq > ?", h.Seq-3).Error; err != nil {
				t.Fatal(err)
			}
			v := verify(auditor)
			if v.OK || v.BrokenAt != h.Seq-2 || v.Anchor == nil || v.Anchor.MissingFrom != h.Seq-2 || v.Anchor.MissingThrough != h.Seq {
				t.Fatalf("verify after the cut: %+v %+v", v, v.Anchor)
			}
			mustContain(t, "reason", v.Reason, fmt.Sprintf("events %d–%d are missing", h.Seq-2, h.Seq),
				fmt.Sprintf("recorded event %d with hash %s", h.Seq, h.Hash), fmt.Sprintf("the log ends at %d", h.Seq-3))
			// No checkpoint was taken over the cut; the export says so.
			r := e.do(request{method: http.MethodGet, path: "/api/v1/orgs/acme/audit/checkpoint", token: auditor})
			wantStatus(t, "export after the cut", r, http.StatusOK)
			exp, err := anchor.ReadExport(bytes.NewReader(r.body))
			if err != nil || exp.Seq != h.Seq || !strings.Contains(exp.Warning, "no longer holds") {
				t.Fatalf("export after the cut: %+v %v", exp, err)
			}
			// The page says it too.
			csrf := "checkpoint-csrf-token-0123456789"
			r = e.do(request{method: http.MethodPost, path: "/o/acme/audit/verify", cookies: []*http.Cookie{{Name: "gh_org_acme", Value: auditor}, {Name: "gh_csrf", Value: csrf}},
				header: http.Header{"X-Csrf-Token": {csrf}}})
			wantStatus(t, "verify page", r, http.StatusSeeOther)
		})

		t.Run("a suspended org's newest checkpoint is answered as it is", func(t *testing.T) {
			release()
			cp, err := e.c.Anchors.Latest(ctx, org)
			if err != nil {
				t.Fatal(err)
			}
			wantStatus(t, "suspend", e.json(http.MethodPost, "/api/v1/orgs/acme/suspend", platform, nil), http.StatusOK)
			r := e.do(request{method: http.MethodGet, path: "/api/v1/audit/checkpoints/acme", token: platform})
			wantStatus(t, "platform export of a suspended org", r, http.StatusOK)
			exp, err := anchor.ReadExport(bytes.NewReader(r.body))
			if err != nil || exp.Seq != cp.Seq || exp.Hash != cp.Hash {
				t.Fatalf("export of the suspended org: %+v %v; newest checkpoint %d", exp, err, cp.Seq)
			}
		})

		t.Run("deleting the org deletes its checkpoints", func(t *testing.T) {
			wantStatus(t, "delete org", e.json(http.MethodDelete, "/api/v1/orgs/acme?confirm=acme", platform, nil), http.StatusNoContent)
			for _, table := range []string{"audit_anchors", "audit_anchor_keys"} {
				var n int64
				if err := e.c.Catalog.Raw("SELECT count(*) FROM "+table+" WHERE org_id = ?", org.ID).Scan(&n).Error; err != nil || n != 0 {
					t.Errorf("%s rows of the deleted org: %d %v", table, n, err)
				}
			}
		})
	})
}

// An export never launders a deleted newest checkpoint: with it deleted
// from the catalog and the events it recorded cut from the org's log, the
// export refuses (409) and writes no checkpoint over the gap.
func TestCheckpointExportRefusesDeletedNewest(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		e := newEnv(t, d)
		platform := e.adminToken()
		e.createOrg(platform, "acme", "Acme")
		root := e.enterOrg(platform, "acme")
		org, err := e.c.Orgs.Get(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		ten, err := e.c.Tenants.Open(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ten.Release)
		export := func() response {
			t.Helper()
			return e.do(request{method: http.MethodGet, path: "/api/v1/orgs/acme/audit/checkpoint", token: root})
		}
		wantStatus(t, "first export", export(), http.StatusOK)
		kept, err := e.c.Anchors.Latest(ctx, org)
		if err != nil {
			t.Fatal(err)
		}
		wantStatus(t, "second export", export(), http.StatusOK)
		newest, err := e.c.Anchors.Latest(ctx, org)
		if err != nil || newest.Seq <= kept.Seq {
			t.Fatalf("the second export took no newer checkpoint: %+v %v (first %d)", newest, err, kept.Seq)
		}
		if err := ten.DB.Exec("DELETE FROM audit_events WHERE seq > ?", kept.Seq).Error; err != nil {
			t.Fatal(err)
		}
		if err := e.c.Catalog.Exec("DELETE FROM audit_anchors WHERE org_id = ? AND seq = ?", org.ID, newest.Seq).Error; err != nil {
			t.Fatal(err)
		}
		r := export()
		wantStatus(t, "export after the newest checkpoint was deleted", r, http.StatusConflict)
		mustContain(t, "refusal", string(r.body), fmt.Sprintf("records a checkpoint of event %d", newest.Seq))
		if cp, err := e.c.Anchors.Latest(ctx, org); err != nil || cp.Seq != kept.Seq {
			t.Fatalf("newest checkpoint after the refused export: %+v %v, want the kept one of event %d", cp, err, kept.Seq)
		}
		wantStatus(t, "platform export", e.do(request{method: http.MethodGet, path: "/api/v1/audit/checkpoints/acme", token: platform}), http.StatusConflict)
	})
}
