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
