//go:build linux

package main_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// TestExecReportingPlatforms: the agentd binary reports exec records as
// root (also for commands it runs as another user, with that user's uid)
// and says "off" with --exec-reporting off; sessions that ask are
// answered accordingly and run either way. (Without the privilege to
// subscribe agentd says "unavailable" the same way; this kernel lets any
// user subscribe, so that case cannot be made here.)
func TestExecReportingPlatforms(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		prefix []string
		args   []string
		want   string
		uid    uint32
	}{
		{"root", nil, nil, agentd.ExecReportingNetlink, 0},
		{"root running commands as nobody", nil, []string{"--run-as", "nobody"}, agentd.ExecReportingNetlink, 65534},
		{"turned off", nil, []string{"--exec-reporting", "off"}, agentd.ExecReportingOff, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := startDaemonVia(t, tt.prefix, tt.args...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			h, err := d.client.Health(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if h.ExecReporting != tt.want || (tt.want != agentd.ExecReportingNetlink) == (h.ExecReportingReason == "") {
				t.Fatalf("health says exec_reporting %q (%q), want %q with a reason unless it reports", h.ExecReporting, h.ExecReportingReason, tt.want)
			}
			resp, err := d.client.CreateSession(ctx, agentd.CreateSessionRequest{Command: `sh -c '/bin/sleep 0.1; true' exec-reporting-marker`,
				WaitMS: 30000, ExecRecords: true})
			if err != nil {
				t.Fatal(err)
			}
			wantAnswer := agentd.ExecRecordsOn
			if tt.want != agentd.ExecReportingNetlink {
				wantAnswer = agentd.ExecRecordsUnavailable
			}
			if resp.ExecRecords != wantAnswer {
				t.Fatalf("create answered %q, want %q", resp.ExecRecords, wantAnswer)
			}
			var recs []agentd.ExecRecord
			collect := func(r *agentd.SessionResponse) error {
				for _, ch := range r.Chunks {
					if ch.Stream == agentd.StreamExec {
						got, err := agentd.ParseExecRecords(ch.Data)
						if err != nil {
							return err
						}
						recs = append(recs, got...)
					}
				}
				return nil
			}
			collect(resp)
			if _, err := d.client.Follow(ctx, resp.SessionID, resp.NextCursor, collect); err != nil {
				t.Fatal(err)
			}
			if tt.want != agentd.ExecReportingNetlink {
				if len(recs) != 0 {
					t.Fatalf("%d exec records without reporting", len(recs))
				}
				return
			}
			for _, r := range recs {
				if r.Type == agentd.ExecRecordExec && r.Depth == 2 && slices.Equal(r.Argv, []string{"/bin/sleep", "0.1"}) {
					if r.UID == nil || *r.UID != tt.uid {
						t.Fatalf("record %+v: want uid %d", r, tt.uid)
					}
					return
				}
			}
			t.Fatalf("no record of /bin/sleep among %d records", len(recs))
		})
	}
}
