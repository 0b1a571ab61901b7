package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/console"
	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// `console audit verify --org` checks the chain against its signed
// checkpoints and takes one; an exported checkpoint verifies offline with
// --checkpoint, alone or against an export (--file); a cut export, an
// edited checkpoint and events deleted from the org's database all fail,
// naming what is missing.
func TestAuditVerifyCheckpoints(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		ctx := context.Background()
		dir := t.TempDir()
		cfg := config.Config{DataDir: dir, TokenTTL: time.Hour, OrgDBPrefix: storetest.NewName("gh_test_org_") + "_"}
		if d == store.Postgres {
			key := make([]byte, 32)
			_, _ = rand.Read(key)
			cfg.DatabaseURL, cfg.MasterKey = storetest.DSN(t, store.Postgres), hex.EncodeToString(key)
			storetest.DropPrefixedAtCleanup(t, cfg.OrgDBPrefix)
		}
		logger := slog.New(slog.NewTextHandler(io.Discard, nil))
		c, err := console.New(ctx, cfg, logger)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		org, err := c.Orgs.Create(ctx, orgs.CreateInput{Slug: "acme", Name: "Acme", OrgEvent: func(o orgs.Org) audit.Event {
			return audit.Event{Actor: audit.Actor{Type: audit.ActorSystem, Name: "test"}, Action: "org.create"}
		}})
		if err != nil {
			t.Fatal(err)
		}
		ten, err := c.Tenants.Open(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ten.Release)
		for i := range 9 {
			if _, err := ten.Audit.Append(ctx, audit.Event{Actor: audit.Actor{Type: audit.ActorUser, ID: "1", Name: "alice"},
				Action: "thing.do", Details: audit.Details(map[string]int{"i": i})}); err != nil {
				t.Fatal(err)
			}
		}
		run := func(args ...string) (string, error) {
			var out bytes.Buffer
			err := auditCmd(ctx, cfg, logger, append([]string{"verify"}, args...), &out)
			return out.String(), err
		}

		out, err := run("--org", "acme")
		if err != nil || !strings.Contains(out, "ok: 10 events verified") || !strings.Contains(out, "checkpoint taken: event 10") ||
			!strings.Contains(out, "a later verify finds events cut off the end or rewritten against it") {
			t.Fatalf("first verify: %v\n%s", err, out)
		}
		out, err = run("--org", "acme")
		if err != nil || !strings.Contains(out, "holds the checkpoint of") || strings.Contains(out, "checkpoint taken") {
			t.Fatalf("second verify: %v\n%s", err, out)
		}

		// What an auditor keeps: an unfiltered export and the checkpoint.
		events := filepath.Join(dir, "events.jsonl")
		var buf bytes.Buffer
		if err := ten.Audit.Export(ctx, audit.Filter{}, &buf, audit.FormatJSONL); err != nil {
			t.Fatal(err)
		}
		writeFile(t, events, buf.Bytes())
		exp, err := c.Anchors.Export(ctx, org)
		if err != nil {
			t.Fatal(err)
		}
		cpPath := filepath.Join(dir, "checkpoint.json")
		writeJSON(t, cpPath, exp)

		t.Run("offline", func(t *testing.T) {
			out, err := run("--file", events, "--checkpoint", cpPath)
			if err != nil || !strings.Contains(out, "checkpoint signature ok") || !strings.Contains(out, "holds the checkpoint of") {
				t.Fatalf("export with its checkpoint: %v\n%s", err, out)
			}
			out, err = run("--checkpoint", cpPath, "--key-fingerprint", exp.PublicKeySHA256)
			if err != nil || !strings.Contains(out, "(pinned)") {
				t.Fatalf("checkpoint alone, pinned: %v\n%s", err, out)
			}
			lines := strings.SplitAfter(strings.TrimSuffix(buf.String(), "\n"), "\n")
			cut := filepath.Join(dir, "cut.jsonl")
			writeFile(t, cut, []byte(strings.Join(lines[:len(lines)-3], "")))
			out, err = run("--file", cut, "--checkpoint", cpPath)
			if !errors.Is(err, errChainBroken) || !strings.Contains(out, "broken at sequence 8: events 8–10 are missing") || !strings.Contains(out, "the file ends at 7") {
				t.Fatalf("cut export: %v\n%s", err, out)
			}
			sig, _ := base64.StdEncoding.DecodeString(exp.Signature)
			sig[0] ^= 1
			edited := exp
			edited.Signature = base64.StdEncoding.EncodeToString(sig)
			bad := filepath.Join(dir, "edited.json")
			writeJSON(t, bad, edited)
			out, err = run("--file", events, "--checkpoint", bad)
			if !errors.Is(err, errCheckpointInvalid) || !strings.Contains(out, "signature does not verify") {
				t.Fatalf("edited checkpoint: %v\n%s", err, out)
			}
		})

		t.Run("newest events deleted", func(t *testing.T) {
			if err := ten.DB.Exec("DELETE FROM audit_events WHERE seq > 7").Error; err != nil {
				t.Fatal(err)
			}
			out, err := run("--org", "acme")
			if !errors.Is(err, errChainBroken) || !strings.Contains(out, "broken at sequence 8: events 8–10 are missing") ||
				!strings.Contains(out, fmt.Sprintf("recorded event 10 with hash %s; the log ends at 7", exp.Hash)) {
				t.Fatalf("verify after the cut: %v\n%s", err, out)
			}
		})
	})
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, b)
}
