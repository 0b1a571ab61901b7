package handlers_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// The retention policy is set through the API (audited, validated, default
// keep everything); a retention run archives and removes the expired
// events; the admin lists and downloads the archive, which verifies on its
// own and ends where the org's verified chain now starts.
func TestRetentionAPI(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		e := newEnv(t, d)
		tok := e.adminToken()
		slug := storetest.NewName("ret-")
		e.createOrg(tok, slug, "Retention")
		org := e.enterOrg(tok, slug)
		base := "/api/v1/orgs/" + slug

		var p struct {
			AuditDays      int `json:"audit_days"`
			RecordingsDays int `json:"recordings_days"`
		}
		r := e.json(http.MethodGet, base+"/settings/retention", org, nil)
		wantStatus(t, "get policy", r, http.StatusOK)
		r.decode(t, &p)
		if p.AuditDays != 0 || p.RecordingsDays != 0 {
			t.Fatalf("default policy %+v, want keep everything", p)
		}
		wantStatus(t, "negative days", e.json(http.MethodPut, base+"/settings/retention", org, map[string]int{"audit_days": -1}), http.StatusBadRequest)
		wantStatus(t, "set policy", e.json(http.MethodPut, base+"/settings/retention", org, map[string]int{"audit_days": 1, "recordings_days": 30}), http.StatusOK)
		_, userTok := e.newOrgUser(org, slug, "member@example.com")
		if r := e.json(http.MethodPut, base+"/settings/retention", userTok, map[string]int{"audit_days": 0}); r.status != http.StatusForbidden {
			t.Fatalf("a member changed the policy: %d", r.status)
		}

		// Two days later every event but the newest has expired.
		e.c.Retention.Now = func() time.Time { return time.Now().Add(48 * time.Hour) }
		res, err := e.c.Retention.ApplyOrg(context.Background(), slug)
		if err != nil {
			t.Fatal(err)
		}
		if res.AuditRemoved == 0 || len(res.Archives) != 1 {
			t.Fatalf("retention run: %+v", res)
		}

		var list struct {
			Items []struct {
				ID       int64  `json:"id"`
				FirstSeq int64  `json:"first_seq"`
				LastSeq  int64  `json:"last_seq"`
				LastHash string `json:"last_hash"`
				Events   int64  `json:"events"`
			} `json:"items"`
		}
		r = e.json(http.MethodGet, base+"/audit/archives", org, nil)
		wantStatus(t, "list archives", r, http.StatusOK)
		r.decode(t, &list)
		if len(list.Items) != 1 || list.Items[0].Events != res.AuditRemoved || list.Items[0].FirstSeq != 1 {
			t.Fatalf("archives: %+v (removed %d)", list.Items, res.AuditRemoved)
		}
		r = e.json(http.MethodGet, fmt.Sprintf("%s/audit/archives/%d", base, list.Items[0].ID), org, nil)
		wantStatus(t, "download archive", r, http.StatusOK)
		archive := r.body
		av, err := audit.VerifyJSONL(bytes.NewReader(archive))
		if err != nil || !av.OK || av.Checked != res.AuditRemoved || av.HeadHash != list.Items[0].LastHash {
			t.Fatalf("archive verify: %+v %v", av, err)
		}
		if r := e.json(http.MethodGet, fmt.Sprintf("%s/audit/archives/%d", base, list.Items[0].ID), userTok, nil); r.status != http.StatusNotFound {
			t.Fatalf("a member downloads an archive: %d", r.status)
		}
		wantStatus(t, "unknown archive", e.json(http.MethodGet, base+"/audit/archives/999", org, nil), http.StatusNotFound)

		var v struct {
			OK            bool   `json:"ok"`
			StartSeq      int64  `json:"start_seq"`
			StartPrevHash string `json:"start_prev_hash"`
		}
		r = e.json(http.MethodPost, base+"/audit/verify", org, nil)
		wantStatus(t, "verify", r, http.StatusOK)
		r.decode(t, &v)
		if !v.OK || v.StartSeq != list.Items[0].LastSeq+1 || v.StartPrevHash != list.Items[0].LastHash {
			t.Fatalf("verify after retention: %+v, archive %+v", v, list.Items[0])
		}
		// The policy change is in the archive (it expired too); the run and
		// the download are in the log.
		if !bytes.Contains(archive, []byte(`"action":"settings.retention"`)) {
			t.Error("the policy change is not in the archive")
		}
		for _, action := range []string{"retention.apply", "audit.archive_download"} {
			var page struct {
				Items []audit.Event `json:"items"`
			}
			r := e.json(http.MethodGet, base+"/audit?q=action:"+action, org, nil)
			wantStatus(t, "audit "+action, r, http.StatusOK)
			r.decode(t, &page)
			if len(page.Items) == 0 {
				t.Errorf("no %s event", action)
			}
		}
	})
}
