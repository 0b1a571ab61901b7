package e2e_test

import (
	"bytes"
	"flag"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/orgs"
	"github.com/gatehouse/gatehouse/internal/store"
)

// updateScreenshots rewrites docs/screenshots from the running console:
//
//	go test ./internal/e2e/ -run Screenshot -update-screenshots
var updateScreenshots = flag.Bool("update-screenshots", false, "write docs/screenshots/*.png")

// TestOrgsPageScreenshot renders the organizations page with a few orgs in
// a real browser and checks it produces an image; with -update-screenshots
// it becomes the README's picture.
func TestOrgsPageScreenshot(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	ctx := t.Context()
	for _, o := range []orgs.CreateInput{
		{Slug: "acme", Name: "Acme Corporation"},
		{Slug: "globex", Name: "Globex Engineering"},
		{Slug: "initech", Name: "Initech"},
	} {
		if _, err := srv.c.Orgs.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := srv.c.Orgs.SetStatus(ctx, "initech", orgs.StatusSuspended); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t)
	do(t, b, "sign in",
		chromedp.EmulateViewport(1100, 380),
		chromedp.Navigate(srv.url+"/login"),
		signIn(adminEmail, adminPassword),
		chromedp.WaitVisible(testid("org-row-initech")),
	)
	img := get(t, b, "screenshot", chromedp.FullScreenshot(100))
	cfg, err := png.DecodeConfig(bytes.NewReader(img))
	if err != nil || cfg.Width < 800 || cfg.Height < 300 {
		t.Fatalf("screenshot is not a usable PNG: %dx%d, %v", cfg.Width, cfg.Height, err)
	}
	if *updateScreenshots {
		out := filepath.Join("..", "..", "docs", "screenshots", "orgs.png")
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, img, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%dx%d)", out, cfg.Width, cfg.Height)
	}
}
