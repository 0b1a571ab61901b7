package e2e_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/store"
)

// TestBrowserApprovals: a department owner finds a pending request (made
// through the service, as the gateway makes them) on the Approvals page,
// with the count in the navigation, sees a second one arrive without
// reloading, approves the first with a reason, and sees it approved.
func TestBrowserApprovals(t *testing.T) {
	t.Parallel()
	srv := newServer(t, store.SQLite)
	email, password, deptID := deptOwnerOrg(t, srv)
	dept, _ := strconv.ParseInt(deptID, 10, 64)
	request := func(cmd string) approvals.Approval {
		t.Helper()
		ten, err := srv.c.Tenants.Open(context.Background(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		defer ten.Release()
		a, err := srv.c.ApprovalQueue(ten).Request(context.Background(), approvals.Binding{SessionID: 1, AgentID: 1, DepartmentID: &dept,
			Requester: approvals.Requester{Type: audit.ActorAPIKey, ID: "99", Name: "coder's key"}, Command: cmd, Program: "git",
			Env: map[string]string{"GIT_TOKEN": "browser-test-secret"}, Rule: "ask git push *"})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	first := request("git push origin main")
	id := strconv.FormatInt(first.ID, 10)

	ctx := newBrowser(t)
	do(t, ctx, "sign in as the department owner", chromedp.Navigate(srv.url+"/o/acme/login"), signIn(email, password),
		chromedp.WaitVisible(testid("nav-approvals-count")))
	if got := text(t, ctx, testid("nav-approvals-count")); got != "1" {
		t.Fatalf("navigation count %q, want 1", got)
	}
	do(t, ctx, "open the Approvals page from the navigation", submits(chromedp.Click(css(`nav[aria-label="Main"] a[href="/o/acme/approvals"]`))),
		chromedp.WaitVisible(testid("approval-row-"+id)))
	mustContain(t, "pending row", text(t, ctx, testid("approval-row-"+id)), "git push origin main", "coder's key", "ask git push *", "#1")
	noSecretInPage(t, ctx, "approvals page", "browser-test-secret")

	second := request("git push origin release")
	do(t, ctx, "the new request appears without a reload", chromedp.WaitVisible(testid("approval-row-"+strconv.FormatInt(second.ID, 10))))

	do(t, ctx, "approve the first for this session", chromedp.SendKeys(css("#reason-"+id), "reviewed the diff"),
		choose("#scope-"+id, "session"),
		submits(chromedp.Click(testid("approval-approve-"+id))),
		waitText(css(`[data-testid="approval-row-`+id+`"] [data-testid="approval-state"]`), "approved"))
	mustContain(t, "decided row", text(t, ctx, testid("approval-row-"+id)), "approved", "owner@acme.test", "session", "reviewed the diff")
	mustContain(t, "flash", text(t, ctx, testid("flash")), "approved")
}
