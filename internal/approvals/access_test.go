package approvals_test

import (
	"context"
	"testing"

	"github.com/gatehouse/gatehouse/internal/approvals"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/authz/authztest"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestAccess runs every method that takes an actor as every kind of
// person against a request of department A made through user 3's key,
// checking the exact outcome and that each refusal is recorded; and
// accounts for every method of the service.
func TestAccess(t *testing.T) {
	t.Parallel()
	A, H, F := authztest.Allowed, authztest.Hidden, authztest.Forbidden
	type outcomes map[string]authztest.Outcome
	cases := map[string]struct {
		run  func(ctx context.Context, w *world, a *authz.Actor, id int64) error
		want outcomes
	}{
		"Get": {func(ctx context.Context, w *world, a *authz.Actor, id int64) error {
			_, err := w.svc.Get(ctx, a, id)
			return err
		}, outcomes{"admin": A, "owner": A, "requester": A, "ownerB": H, "auditor": A, "plain": H}},
		"Decide": {func(ctx context.Context, w *world, a *authz.Actor, id int64) error {
			_, err := w.svc.Decide(ctx, a, id, approvals.Approve, approvals.ScopeOnce, "")
			return err
		}, outcomes{"admin": A, "owner": A, "requester": F, "ownerB": H, "auditor": F, "plain": H}},
		"Cancel": {func(ctx context.Context, w *world, a *authz.Actor, id int64) error {
			_, err := w.svc.Cancel(ctx, a, id)
			return err
		}, outcomes{"admin": F, "owner": F, "requester": A, "ownerB": H, "auditor": F, "plain": H}},
	}
	// Answers, not refusals: filtered to what the actor may see or decide.
	answers := map[string]func(ctx context.Context, w *world, a *authz.Actor, id int64) error{
		"List": func(ctx context.Context, w *world, a *authz.Actor, _ int64) error {
			_, err := w.svc.List(ctx, a, approvals.Filter{})
			return err
		},
		"PendingCount": func(ctx context.Context, w *world, a *authz.Actor, _ int64) error {
			_, err := w.svc.PendingCount(ctx, a)
			return err
		},
		"CanDecide": func(ctx context.Context, w *world, a *authz.Actor, id int64) error {
			_, err := w.svc.CanDecide(ctx, a, approvals.Approval{ID: id})
			return err
		},
	}
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newWorld(t, storetest.Open(t, d, store.OrgSet))
		ctx := context.Background()
		people := map[string]func() *authz.Actor{
			"admin":     func() *authz.Actor { return w.actor(t, 1) },
			"owner":     func() *authz.Actor { return w.actor(t, 2) },
			"requester": func() *authz.Actor { return w.actor(t, 3) },
			"ownerB":    func() *authz.Actor { return w.actor(t, 5) },
			"auditor":   func() *authz.Actor { return w.actor(t, 6) },
			"plain":     func() *authz.Actor { return w.actor(t, 8) },
		}
		for name, tc := range cases {
			for who, want := range tc.want {
				t.Run(name+"/"+who, func(t *testing.T) {
					a := people[who]()
					id := w.request(t, w.binding("git push")).ID
					authztest.Want(t, a, tc.run(ctx, w, a, id), want)
				})
			}
		}
		for name, run := range answers {
			for who := range people {
				a := people[who]()
				if err := run(ctx, w, a, w.request(t, w.binding("git push")).ID); err != nil || len(a.Denials()) != 0 {
					t.Errorf("%s as %s: %v, denials %+v", name, who, err, a.Denials())
				}
			}
		}
	})
	tested := map[string]bool{}
	for name := range cases {
		tested[name] = true
	}
	for name := range answers {
		tested[name] = true
	}
	authztest.Accounted(t, &approvals.Service{}, tested, map[string]string{
		"Request":    "the gateway calls it after authorizing the exec; the requester is in the binding",
		"Wait":       "the gateway's caller already made the request it waits for",
		"Sweep":      "the system's expiry of due requests",
		"SetCommand": "the gateway's start of an approved command, in its own transaction",
		"GetWebhook": "org settings: the route requires settings:read",
		"SetWebhook": "org settings: the route requires settings:update",
	})
}
