package e2b_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/directory"
	"github.com/gatehouse/gatehouse/internal/e2b"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sealed"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// listWorld is an org database with one host agent, its owner's e2b key
// (acting as the key's actor, with no role: it sees the owner's sessions
// only), another key of the same agent, and another user.
type listWorld struct {
	db       *gorm.DB
	svc      *sessions.Service
	agent    int64
	owner    directory.User
	other    directory.User
	key      directory.APIKey
	otherKey directory.APIKey
	actor    *authz.Actor
}

func newListWorld(t *testing.T, d store.Dialect) *listWorld {
	t.Helper()
	ctx := context.Background()
	db := storetest.Open(t, d, store.OrgSet)
	en, err := rbac.NewEnforcer(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	sys := authz.System("test")
	box, err := sealed.New(make([]byte, sealed.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	es := &envs.Service{DB: db, Box: box, Org: "acme"}
	name, kind, url, osName, dep, tok := "host", envs.KindHost, "https://host:49984", "linux", "cloud-vm", "t"
	for len(tok) < envs.MinTokenLength {
		tok += "t"
	}
	env, err := es.Create(ctx, sys, envs.Input{Name: &name, Kind: kind, URL: &url, OS: &osName, Deployment: &dep, AgentdToken: &tok})
	if err != nil {
		t.Fatal(err)
	}
	agName, cfg, mode := "coder", `{"model":"m"}`, agents.SandboxOff
	ag, err := (&agents.Service{DB: db, Envs: es}).Create(ctx, sys, agents.Input{Name: &agName, Config: &cfg, SandboxMode: &mode,
		EnvironmentIDs: []int64{env.ID}})
	if err != nil {
		t.Fatal(err)
	}
	w := &listWorld{db: db, svc: &sessions.Service{DB: db}, agent: ag.ID}
	dir := &directory.Directory{DB: db}
	if w.owner, _, err = dir.CreateUser(ctx, "owner@example.com", "Owner"); err != nil {
		t.Fatal(err)
	}
	if w.other, _, err = dir.CreateUser(ctx, "other@example.com", "Other"); err != nil {
		t.Fatal(err)
	}
	mint := func(name string) directory.APIKey {
		k, _, err := dir.CreateKey(ctx, directory.NewKey{Name: name, Owner: &w.owner.ID, CreatedBy: "test", Agent: &ag.ID})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	w.key, w.otherKey = mint("runtime"), mint("another runtime")
	w.actor = authz.New(e2b.KeyPrincipal(w.key, &w.owner), en, nil)
	return w
}

// sessions inserts n sessions of the agent owned by user in state, in one
// statement (the lifecycle is not what is tested), and returns their ids.
func (w *listWorld) sessions(t *testing.T, n int, user directory.User, state string) []int64 {
	t.Helper()
	now := time.Now().UTC()
	rows := make([]sessions.Session, n)
	for i := range rows {
		uid := user.ID
		rows[i] = sessions.Session{AgentID: w.agent, UserID: &uid, Subject: rbac.UserSubject(user.ID), CreatedBy: user.Email,
			SandboxMode: agents.SandboxOff, State: state, CreatedAt: now, UpdatedAt: now}
	}
	if err := w.db.Omit("AgentName", "AgentDepartmentID").CreateInBatches(&rows, 100).Error; err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, n)
	for i, s := range rows {
		ids[i] = s.ID
	}
	return ids
}

// sandbox records a sandbox made by key on a new session of user in state.
func (w *listWorld) sandbox(t *testing.T, key directory.APIKey, user directory.User, state, metadata string) e2b.Sandbox {
	t.Helper()
	x := e2b.Sandbox{SessionID: w.sessions(t, 1, user, state)[0], SandboxID: e2b.NewSandboxID("acme"), KeyID: key.ID, AgentID: w.agent,
		TemplateID: "base", Metadata: metadata, TokenSealed: "sealed", CreatedAt: time.Now().UTC()}
	if err := e2b.Insert(context.Background(), w.db, &x); err != nil {
		t.Fatal(err)
	}
	return x
}

// walk lists every page of q, failing on a repeated sandbox or an empty
// page that still names a next one; it returns the sandbox ids in order
// and the number of pages.
func (w *listWorld) walk(t *testing.T, q e2b.ListQuery) ([]string, int) {
	t.Helper()
	var ids []string
	seen := map[string]bool{}
	for pages := 1; ; pages++ {
		p, err := e2b.List(context.Background(), w.db, w.svc, w.actor, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Items) == 0 && p.NextToken != "" {
			t.Fatalf("page %d is empty but names a next one", pages)
		}
		if q.Limit > 0 && len(p.Items) > q.Limit {
			t.Fatalf("page %d holds %d sandboxes, more than the limit %d", pages, len(p.Items), q.Limit)
		}
		for _, e := range p.Items {
			if seen[e.Sandbox.SandboxID] {
				t.Fatalf("sandbox %s listed twice (page %d)", e.Sandbox.SandboxID, pages)
			}
			if e.Session.ID != e.Sandbox.SessionID {
				t.Fatalf("sandbox %s answered with session %d, not its own %d", e.Sandbox.SandboxID, e.Session.ID, e.Sandbox.SessionID)
			}
			seen[e.Sandbox.SandboxID] = true
			ids = append(ids, e.Sandbox.SandboxID)
		}
		if p.NextToken == "" {
			return ids, pages
		}
		if pages > 50 {
			t.Fatal("the pages never end")
		}
		q.NextToken = p.NextToken
	}
}

// A key's running sandbox is listed however many other sessions its agent
// has: the list follows the key's sandboxes, not a window of the agent's
// latest sessions (the owner's 250 console sessions, all visible to the
// key's actor, are newer than it).
func TestListFollowsTheKeysSandboxes(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newListWorld(t, d)
		mine := w.sandbox(t, w.key, w.owner, sessions.StateRunning, `{}`)
		w.sessions(t, 250, w.owner, sessions.StateRunning)
		w.sandbox(t, w.otherKey, w.owner, sessions.StateRunning, `{}`) // another key's
		w.sandbox(t, w.key, w.owner, sessions.StateClosed, `{}`)       // killed
		w.sandbox(t, w.key, w.owner, sessions.StateLost, `{}`)         // lost
		p, err := e2b.List(context.Background(), w.db, w.svc, w.actor, e2b.ListQuery{KeyID: w.key.ID, AgentID: w.agent})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Items) != 1 || p.Items[0].Sandbox.SandboxID != mine.SandboxID || p.NextToken != "" {
			t.Fatalf("listed %+v (next %q), want only %s", p.Items, p.NextToken, mine.SandboxID)
		}
		if p.Items[0].Session.State != sessions.StateRunning || p.Items[0].Session.AgentName != "coder" {
			t.Fatalf("session %+v", p.Items[0].Session)
		}
	})
}

// Paging walks every sandbox the key may see exactly once, newest first,
// under each filter, whatever the page size; the last page names no next
// one (also when it is exactly full), and the filtered-out sandboxes
// between pages neither repeat nor hide any.
func TestListPages(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newListWorld(t, d)
		type made struct {
			id, state string
			alice     bool
		}
		var all []made // newest first
		for i := 0; i < 11; i++ {
			state, meta := sessions.StateRunning, `{"user":"bob"}`
			if i%3 == 1 {
				state = sessions.StatePaused
			}
			if i%2 == 0 {
				meta = `{"user":"alice","n":"` + fmt.Sprint(i) + `"}`
			}
			if i == 4 {
				state = sessions.StatePending // listed as running
			}
			x := w.sandbox(t, w.key, w.owner, state, meta)
			all = slices.Insert(all, 0, made{id: x.SandboxID, state: e2b.StateOf(sessions.Session{State: state}), alice: i%2 == 0})
			// Rows that are never listed, between the listed ones: a
			// killed sandbox, another key's, and one whose session the
			// key's owner may not see.
			w.sandbox(t, w.key, w.owner, sessions.StateClosed, meta)
			w.sandbox(t, w.otherKey, w.owner, state, meta)
			w.sandbox(t, w.key, w.other, state, meta)
		}
		for _, tc := range []struct {
			name   string
			states []string
			meta   map[string]string
			keep   func(made) bool
		}{
			{"all", nil, nil, func(made) bool { return true }},
			{"running", []string{e2b.StateRunning}, nil, func(m made) bool { return m.state == e2b.StateRunning }},
			{"paused", []string{e2b.StatePaused}, nil, func(m made) bool { return m.state == e2b.StatePaused }},
			{"both states", []string{e2b.StatePaused, e2b.StateRunning}, nil, func(made) bool { return true }},
			{"alice's", nil, map[string]string{"user": "alice"}, func(m made) bool { return m.alice }},
			{"alice's running", []string{e2b.StateRunning}, map[string]string{"user": "alice"},
				func(m made) bool { return m.alice && m.state == e2b.StateRunning }},
			{"nobody's", nil, map[string]string{"user": "carol"}, func(made) bool { return false }},
		} {
			var want []string
			for _, m := range all {
				if tc.keep(m) {
					want = append(want, m.id)
				}
			}
			for _, limit := range []int{1, 2, 3, len(want), 0} {
				if limit == 0 && len(want) == 0 {
					continue
				}
				got, pages := w.walk(t, e2b.ListQuery{KeyID: w.key.ID, AgentID: w.agent, States: tc.states, Metadata: tc.meta, Limit: limit})
				if !slices.Equal(got, want) {
					t.Errorf("%s, limit %d: listed %v, want %v", tc.name, limit, got, want)
				}
				wantPages := 1
				if limit > 0 && len(want) > 0 {
					wantPages = (len(want) + limit - 1) / limit
				}
				if pages != wantPages {
					t.Errorf("%s, limit %d: %d pages for %d sandboxes, want %d", tc.name, limit, pages, len(want), wantPages)
				}
			}
		}
	})
}

// A nextToken that no list answered is refused as invalid input naming
// the parameter, before anything is read.
func TestListRefusesABadNextToken(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{"abc", "0", "-3", "1.5", "12abc", " 7"} {
		_, err := e2b.List(context.Background(), nil, nil, nil, e2b.ListQuery{KeyID: 1, AgentID: 1, NextToken: tok})
		var v *apperr.ValidationError
		if !errors.Is(err, apperr.ErrInvalid) || !errors.As(err, &v) || v.Fields["nextToken"] == "" {
			t.Errorf("nextToken %q: %v, want a validation error on nextToken", tok, err)
		}
	}
}

// TestListReadsInPageSizedBatches: a filter that matches almost nothing
// costs a query per page of rows, not per sandbox, and one answer reads a
// bounded number of rows: past that it answers short, with a token that
// goes on from the last row read, so walking still finds every match.
func TestListReadsInPageSizedBatches(t *testing.T) {
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		w := newListWorld(t, d)
		match := w.sandbox(t, w.key, w.owner, sessions.StateRunning, `{"pick":"me"}`)
		const n = 1100 // more than ten batches of MaxListLimit+1 rows
		ids := w.sessions(t, n, w.owner, sessions.StateRunning)
		rows := make([]e2b.Sandbox, n)
		for i, sid := range ids {
			rows[i] = e2b.Sandbox{SessionID: sid, SandboxID: e2b.NewSandboxID("acme"), KeyID: w.key.ID, AgentID: w.agent,
				TemplateID: "base", Metadata: `{"pick":"not-me"}`, TokenSealed: "sealed", CreatedAt: time.Now().UTC()}
		}
		if err := w.db.CreateInBatches(&rows, 200).Error; err != nil {
			t.Fatal(err)
		}
		var reads int
		if err := w.db.Callback().Query().After("gorm:query").Register("count_e2b_reads", func(tx *gorm.DB) {
			if tx.Statement.Table == "e2b_sandboxes" {
				reads++
			}
		}); err != nil {
			t.Fatal(err)
		}
		q := e2b.ListQuery{KeyID: w.key.ID, AgentID: w.agent, Metadata: map[string]string{"pick": "me"}, Limit: 1}
		first, err := e2b.List(context.Background(), w.db, w.svc, w.actor, q)
		if err != nil {
			t.Fatal(err)
		}
		if reads == 0 || reads > 10 || len(first.Items) != 0 || first.NextToken == "" {
			t.Fatalf("first answer: %d row reads, %d items, token %q; want at most 10 reads, a short page and a token to go on",
				reads, len(first.Items), first.NextToken)
		}
		var found []string
		for p, pages := first, 1; ; pages++ {
			for _, e := range p.Items {
				found = append(found, e.Sandbox.SandboxID)
			}
			if p.NextToken == "" {
				break
			}
			if pages > 5 {
				t.Fatalf("still listing after %d answers", pages)
			}
			q.NextToken = p.NextToken
			if p, err = e2b.List(context.Background(), w.db, w.svc, w.actor, q); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(found, []string{match.SandboxID}) {
			t.Fatalf("walking the pages found %v, want only %s", found, match.SandboxID)
		}
	})
}
