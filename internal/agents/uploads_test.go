package agents_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/archivetest"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestPutUpload checks every rule an upload must pass, and that a valid
// one is stored hashed, listed without its contents and replaced in place.
func TestPutUpload(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, d)
		ctx := context.Background()
		ag := w.agentInA(t)
		good := archivetest.TarGz(t, map[string]string{"SKILL.md": "# git"})
		cases := []struct {
			name string
			in   agents.UploadInput
			want string // "" is accepted
		}{
			{"tar.gz bundle", agents.UploadInput{Kind: agents.UploadSkill, Name: "git", FileName: "git.tar.gz", Body: good}, ""},
			{"zip bundle", agents.UploadInput{Kind: agents.UploadSkill, Name: "zipped", FileName: "Z.ZIP", Body: archivetest.Zip(t, map[string]string{"a/b.txt": "b"})}, ""},
			{"file", agents.UploadInput{Kind: agents.UploadFile, Name: "notes/brief.md", Body: []byte("brief")}, ""},
			{"over 50 MiB", agents.UploadInput{Kind: agents.UploadFile, Name: "big.bin", Body: make([]byte, agents.MaxUploadBytes+1)}, "50 MiB limit"},
			{"empty", agents.UploadInput{Kind: agents.UploadFile, Name: "e.txt", Body: nil}, "empty"},
			{"not an archive", agents.UploadInput{Kind: agents.UploadSkill, Name: "bad", FileName: "bad.tar.gz", Body: []byte("plain text")}, "not a readable tar.gz archive"},
			{"truncated archive", agents.UploadInput{Kind: agents.UploadSkill, Name: "cut", FileName: "cut.tgz", Body: good[:len(good)/2]}, "not a readable tar.gz archive"},
			{"escaping entry", agents.UploadInput{Kind: agents.UploadSkill, Name: "esc", FileName: "esc.zip", Body: archivetest.Zip(t, map[string]string{"../evil": "x"})}, "leaves the bundle's directory"},
			{"wrong extension", agents.UploadInput{Kind: agents.UploadSkill, Name: "x", FileName: "x.rar", Body: good}, ".tar.gz, .tgz or .zip"},
			{"bad bundle name", agents.UploadInput{Kind: agents.UploadSkill, Name: "Git Tools", FileName: "g.tgz", Body: good}, "bundle's name must be"},
			{"dotdot path", agents.UploadInput{Kind: agents.UploadFile, Name: "a/../../etc/passwd", Body: []byte("x")}, "relative to the workspace"},
			{"absolute path", agents.UploadInput{Kind: agents.UploadFile, Name: "/etc/passwd", Body: []byte("x")}, "relative to the workspace"},
			{"bad kind", agents.UploadInput{Kind: "dir", Name: "x", Body: []byte("x")}, `"skill" (an archive) or "file"`},
		}
		for _, tc := range cases {
			_, u, err := w.svc.PutUpload(ctx, w.admin, ag.ID, tc.in)
			if tc.want == "" {
				sum := sha256.Sum256(tc.in.Body)
				if err != nil || u.SHA256 != hex.EncodeToString(sum[:]) || u.Size != int64(len(tc.in.Body)) || u.Content != nil {
					t.Errorf("%s: %+v, %v; want it stored with its hash and no content returned", tc.name, u, err)
				}
				continue
			}
			var ve *apperr.ValidationError
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &ve) {
				t.Errorf("%s: %v, want a validation error saying %q", tc.name, err, tc.want)
			}
		}
		before, after, err := w.svc.PutUpload(ctx, w.admin, ag.ID, agents.UploadInput{Kind: agents.UploadFile, Name: "notes/brief.md", Body: []byte("brief v2")})
		if err != nil || before == nil || before.Size != 5 || after.Size != 8 || after.ID != before.ID {
			t.Fatalf("replace: before %+v after %+v %v", before, after, err)
		}
		list, err := w.svc.Uploads(ctx, w.admin, ag.ID)
		if err != nil || len(list) != 3 {
			t.Fatalf("list: %d uploads, %v; want 3", len(list), err)
		}
		for _, u := range list {
			if u.Content != nil {
				t.Errorf("listing %s carries its contents", u.Name)
			}
		}
		full, err := w.svc.UploadContent(ctx, w.admin, ag.ID, agents.UploadFile, "notes/brief.md")
		if err != nil || string(full.Content) != "brief v2" {
			t.Fatalf("contents: %+v %v", full, err)
		}
		if _, err := w.svc.UploadContent(ctx, w.admin, ag.ID, agents.UploadFile, "nope.md"); err == nil || !strings.Contains(err.Error(), "no file named") {
			t.Fatalf("contents of a missing upload: %v, want not found", err)
		}
		if _, err := w.svc.RemoveUpload(ctx, w.admin, ag.ID, agents.UploadFile, "notes/brief.md"); err != nil {
			t.Fatal(err)
		}
		if _, err := w.svc.RemoveUpload(ctx, w.admin, ag.ID, agents.UploadFile, "notes/brief.md"); err == nil || !strings.Contains(err.Error(), "no file named") {
			t.Fatalf("removing it twice: %v, want not found", err)
		}
	})
}
