package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/config"
)

// writeArchive writes a linked chain of n events starting after prev, as
// an archive holds them.
func writeArchive(t *testing.T, path string, first int64, prev string, n int) {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	at := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		e := audit.Event{Seq: first + int64(i), Time: at.Add(time.Duration(i) * time.Minute), Actor: audit.Actor{Type: "user", Name: "alice"},
			Action: "thing.do", Decision: audit.Allow, Details: json.RawMessage(`{}`), PrevHash: prev}
		e.Hash = audit.Hash(e)
		prev = e.Hash
		if err := enc.Encode(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// console audit verify --file checks an archive without any database; an
// event edited in it fails at its sequence.
func TestAuditVerifyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "archive.jsonl")
	writeArchive(t, path, 101, "abc123", 20)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	var out bytes.Buffer
	if err := auditCmd(context.Background(), config.Config{}, logger, []string{"verify", "--file", path}, &out); err != nil {
		t.Fatalf("verify: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "ok: 20 events verified (sequence 101 to 120)") || !strings.Contains(out.String(), "starts after: abc123") {
		t.Fatalf("output: %s", out.String())
	}
	b, _ := os.ReadFile(path)
	edited := strings.Replace(string(b), `"seq":105,"time":"2026-02-01T00:04:00Z","actor":{"type":"user","id":"","name":"alice"}`,
		`"seq":105,"time":"2026-02-01T00:04:00Z","actor":{"type":"user","id":"","name":"mallory"}`, 1)
	if edited == string(b) {
		t.Fatal("test did not edit the archive")
	}
	if err := os.WriteFile(path, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err := auditCmd(context.Background(), config.Config{}, logger, []string{"verify", "--file", path}, &out)
	if !errors.Is(err, errChainBroken) || !strings.Contains(out.String(), "broken at sequence 105") {
		t.Fatalf("edited archive: %v %s", err, out.String())
	}
}

// A filtered export is not a broken chain: verify says what it is and
// exits non-zero, having verified nothing.
func TestAuditVerifyFilteredExport(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "archive.jsonl")
	writeArchive(t, path, 1, "", 5)
	b, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(b), "\n")
	header := `{"#export":{"filtered":true,"query":"actor:alice","note":"filtered export"}}` + "\n"
	// Events 1, 3 and 5 of the five: gaps a filter leaves.
	if err := os.WriteFile(path, []byte(header+lines[0]+lines[2]+lines[4]), 0o600); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	var out bytes.Buffer
	err := auditCmd(context.Background(), config.Config{}, logger, []string{"verify", "--file", path}, &out)
	if !errors.Is(err, errFilteredExport) || strings.Contains(out.String(), "broken") ||
		!strings.Contains(out.String(), "filtered export: the chain cannot be checked from it; export unfiltered") {
		t.Fatalf("verify: %v\n%s", err, out.String())
	}
}
