package handlers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/config"
	"github.com/gatehouse/gatehouse/internal/e2b"
	"github.com/gatehouse/gatehouse/internal/e2b/gen/process"
	"github.com/gatehouse/gatehouse/internal/e2b/gen/process/processconnect"
	"github.com/gatehouse/gatehouse/internal/rbac"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// e2bSDK sends a request as the E2B JS SDK (2.51) does: X-API-Key, its
// user agent, a JSON body.
func (e *testEnv) e2bSDK(method, path, key string, body any) response {
	e.t.Helper()
	h := http.Header{"X-Api-Key": {key}, "User-Agent": {"e2b-js-sdk/2.51.0"}}
	r := request{method: method, path: path, header: h}
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			e.t.Fatal(err)
		}
		r.body, r.contentType = bytes.NewReader(b), "application/json"
	}
	return e.do(r)
}

// e2bSandboxAgent makes a sandbox environment on a fake backend running
// real agentd processes, its template "base", and an agent of department
// dept per session sandboxes on it; it returns the agent's id.
func e2bSandboxAgent(t *testing.T, e *testEnv, fake *e2bfake.Server, slug, root string, dept int64, name string) int64 {
	t.Helper()
	base := "/api/v1/orgs/" + slug
	env := map[string]any{"name": name + "-sandboxes", "kind": "sandbox", "url": fake.URL(), "proxy_base_url": fake.ProxyURL(),
		"sandbox_scheme": "http", "api_key": e2bfaketest.APIKey, "agentd_token": e2bfaketest.Token}
	if dept != 0 {
		env["department_id"] = dept
	}
	r := e.json(http.MethodPost, base+"/environments", root, env)
	wantStatus(t, "sandbox environment", r, http.StatusCreated)
	var envOut, tpl, ag struct{ ID int64 }
	r.decode(t, &envOut)
	r = e.json(http.MethodPost, base+"/environments/"+itoa(envOut.ID)+"/templates", root, map[string]any{"import": true, "backend_template_id": "base"})
	wantStatus(t, "template", r, http.StatusCreated)
	r.decode(t, &tpl)
	a := map[string]any{"name": name, "config": map[string]string{"model": "m"}, "sandbox_mode": "per-session", "template_id": tpl.ID,
		"environment_ids": []int64{envOut.ID}}
	if dept != 0 {
		a["department_id"] = dept
	}
	r = e.json(http.MethodPost, base+"/agents", root, a)
	wantStatus(t, "agent", r, http.StatusCreated)
	r.decode(t, &ag)
	return ag.ID
}

type e2bKeyMinted struct {
	Key  string `json:"key"`
	ID   int64  `json:"id"`
	Item struct {
		Masked  string `json:"masked"`
		AgentID int64  `json:"agent_id"`
	} `json:"item"`
}

func mintE2BKey(t *testing.T, e *testEnv, slug, token string, agentID int64, name string) e2bKeyMinted {
	t.Helper()
	r := e.json(http.MethodPost, "/api/v1/orgs/"+slug+"/e2b-keys", token, map[string]any{"agent_id": agentID, "name": name})
	wantStatus(t, "mint e2b key "+name, r, http.StatusCreated)
	var k e2bKeyMinted
	r.decode(t, &k)
	return k
}

type e2bSandboxOut struct {
	SandboxID       string `json:"sandboxID"`
	TemplateID      string `json:"templateID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken"`
	Domain          string `json:"domain"`
}

type e2bListedOut struct {
	SandboxID string            `json:"sandboxID"`
	State     string            `json:"state"`
	EndAt     time.Time         `json:"endAt"`
	Metadata  map[string]string `json:"metadata"`
}

// e2bError decodes E2B's error shape, failing when the body is not one.
func e2bError(t *testing.T, r response) (int, string) {
	t.Helper()
	var out struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil || out.Code != r.status || out.Message == "" {
		t.Fatalf("status %d: body is not E2B's error {\"code\",\"message\"}: %s (%v)", r.status, r.body, err)
	}
	return out.Code, out.Message
}

// sdkMetadataQuery encodes a metadata filter as the JS SDK does:
// encodeURIComponent on each key and value, URLSearchParams over the
// pairs, and the query string's own encoding on top.
func sdkMetadataQuery(k, v string) string {
	enc := func(s string) string { return strings.ReplaceAll(url.QueryEscape(s), "+", "%20") }
	return "metadata=" + url.QueryEscape(url.Values{enc(k): {enc(v)}}.Encode())
}

// TestE2BControlPlane drives an org's E2B-compatible control plane with
// the SDK's own requests, on both databases, against a fake backend whose
// sandboxes run real agentd processes: keys, the sandbox lifecycle, the
// data plane's resolver, isolation between orgs and agents, revocation,
// and that the backend's secrets reach no answer or log.
func TestE2BControlPlane(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e := f.e
		fake := e2bfaketest.New(t, agentdBin, e2bfake.Config{})
		root := f.tokens["entered-admin"]
		agent := e2bSandboxAgent(t, e, fake, "acme", root, f.dept1, "coder")
		other := e2bSandboxAgent(t, e, fake, "acme", root, f.dept1, "reviewer")
		groot := e.enterOrg(f.platform, "globex")
		gagent := e2bSandboxAgent(t, e, fake, "globex", groot, 0, "globex-coder")
		api := "/e2b/orgs/acme"
		var answers []string // every e2b answer body, for the leak check
		sdk := func(method, path, key string, body any) response {
			r := e.e2bSDK(method, path, key, body)
			answers = append(answers, string(r.body))
			return r
		}

		var key, otherKey, gkey e2bKeyMinted
		t.Run("keys are minted for an agent one may start sessions of, shown once, listed masked", func(t *testing.T) {
			key = mintE2BKey(t, e, "acme", f.tokens["member"], agent, "runtime")
			if !regexp.MustCompile(`^e2b_[0-9a-f]{64}$`).MatchString(key.Key) {
				t.Fatalf("key %q does not have the shape the SDKs require", key.Key)
			}
			if key.Item.AgentID != agent || !strings.HasPrefix(key.Item.Masked, "e2b_") || strings.Contains(key.Item.Masked, key.Key[16:]) {
				t.Fatalf("listing %+v", key.Item)
			}
			otherKey = mintE2BKey(t, e, "acme", f.tokens["member"], other, "reviewer runtime")
			gkey = mintE2BKey(t, e, "globex", f.tokens["globex-admin"], gagent, "globex runtime")
			for name, want := range map[string]int{"plain": http.StatusNotFound, "auditor": http.StatusForbidden, "member-key": http.StatusForbidden,
				"globex-admin": http.StatusUnauthorized} {
				tok := f.tokens[name]
				if tok == "" {
					tok = f.keys[name]
				}
				wantStatus(t, "mint as "+name, e.json(http.MethodPost, "/api/v1/orgs/acme/e2b-keys", tok, map[string]any{"agent_id": agent, "name": "x"}), want)
			}
			wantStatus(t, "mint without agent", e.json(http.MethodPost, "/api/v1/orgs/acme/e2b-keys", f.tokens["member"], map[string]any{"name": "x"}),
				http.StatusBadRequest)
			r := e.json(http.MethodGet, "/api/v1/orgs/acme/e2b-keys", f.tokens["member"], nil)
			wantStatus(t, "list", r, http.StatusOK)
			var list struct {
				Items []struct{ ID int64 } `json:"items"`
			}
			r.decode(t, &list)
			if len(list.Items) != 2 || strings.Contains(string(r.body), key.Key) || strings.Contains(string(r.body), key.Key[16:]) {
				t.Fatalf("member's e2b keys: %s", r.body)
			}
			r = e.json(http.MethodGet, "/api/v1/orgs/acme/api-keys", f.tokens["member"], nil)
			mustContain(t, "among the API keys", string(r.body), `"kind":"e2b"`, key.Item.Masked)
			var all struct {
				Items []struct {
					ID   int64  `json:"id"`
					Kind string `json:"kind"`
				} `json:"items"`
			}
			r.decode(t, &all)
			plain := int64(0)
			for _, k := range all.Items {
				if k.Kind != "e2b" {
					plain = k.ID
				}
			}
			if plain == 0 {
				t.Fatalf("member has no ordinary key to try: %s", r.body)
			}
			wantStatus(t, "revoke an ordinary key as an e2b key", e.json(http.MethodDelete, "/api/v1/orgs/acme/e2b-keys/"+itoa(plain), f.tokens["member"], nil),
				http.StatusNotFound)
			wantStatus(t, "the ordinary key still works", e.json(http.MethodGet, "/api/v1/orgs/acme/me", f.keys["member-key"], nil), http.StatusOK)
			r = e.json(http.MethodGet, "/api/v1/orgs/acme/e2b-keys", f.tokens["plain"], nil)
			r.decode(t, &list)
			if len(list.Items) != 0 {
				t.Fatalf("another user sees %d e2b keys", len(list.Items))
			}
		})

		t.Run("each kind of key opens only its own surface", func(t *testing.T) {
			wantStatus(t, "e2b key on the console API", e.json(http.MethodGet, "/api/v1/orgs/acme/sessions", key.Key, nil), http.StatusUnauthorized)
			forged := "gh_" + key.Key[4:16] + "_" + key.Key[16:] // the e2b key's row and secret in an ordinary key's shape
			wantStatus(t, "e2b key reshaped as a gh_ key", e.json(http.MethodGet, "/api/v1/orgs/acme/sessions", forged, nil), http.StatusUnauthorized)
			for name, k := range map[string]string{"gh_ key": f.keys["member-key"], "a sign-in": f.tokens["member"], "no key": "", "malformed": "e2b_zz", "unknown": "e2b_" + strings.Repeat("ab", 32),
				"another org's": gkey.Key} {
				r := sdk(http.MethodGet, api+"/v2/sandboxes", k, nil)
				wantStatus(t, name, r, http.StatusUnauthorized)
				e2bError(t, r)
			}
			r := sdk(http.MethodGet, "/e2b/orgs/nope/v2/sandboxes", key.Key, nil)
			wantStatus(t, "unknown org", r, http.StatusNotFound)
			e2bError(t, r)
		})

		var sb e2bSandboxOut
		meta := map[string]string{"user": "alice b&c=d/é"}
		t.Run("create answers E2B's Sandbox with the console's id, domain and token", func(t *testing.T) {
			r := sdk(http.MethodPost, api+"/v2/sandboxes", key.Key, map[string]any{"templateID": "base", "timeout": 300, "metadata": meta,
				"allow_internet_access": true, "secure": true})
			wantStatus(t, "create", r, http.StatusCreated)
			r.decode(t, &sb)
			if _, ok := e2b.OrgOf(sb.SandboxID); !ok || !strings.HasPrefix(sb.SandboxID, "acme-") {
				t.Fatalf("sandbox id %q does not name its org", sb.SandboxID)
			}
			if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(sb.EnvdAccessToken) || sb.Domain != e2b.PlaceholderDomain ||
				sb.EnvdVersion != e2b.EnvdVersion || sb.ClientID != "gatehouse" || sb.TemplateID != "base" {
				t.Fatalf("create answered %+v", sb)
			}
			r = sdk(http.MethodPost, api+"/sandboxes", key.Key, map[string]any{"templateID": "ubuntu-gpu"})
			wantStatus(t, "another template", r, http.StatusBadRequest)
			_, msg := e2bError(t, r)
			mustContain(t, "template refusal", msg, "templateID")
			for name, body := range map[string]map[string]any{
				"zero timeout":          {"templateID": "base", "timeout": 0},
				"sandbox-wide env vars": {"templateID": "base", "envVars": map[string]string{"A": "b"}},
				"pause at timeout":      {"templateID": "base", "autoPause": true},
				"not JSON":              nil,
			} {
				if body != nil {
					r = sdk(http.MethodPost, api+"/sandboxes", key.Key, body)
				} else {
					r = e.do(request{method: http.MethodPost, path: api + "/sandboxes", body: strings.NewReader("{"), contentType: "application/json",
						header: http.Header{"X-Api-Key": {key.Key}}})
				}
				wantStatus(t, name, r, http.StatusBadRequest)
				e2bError(t, r)
			}
		})

		t.Run("get, list, connect, timeout and pause", func(t *testing.T) {
			r := sdk(http.MethodGet, api+"/sandboxes/"+sb.SandboxID, key.Key, nil)
			wantStatus(t, "get", r, http.StatusOK)
			var got e2bListedOut
			r.decode(t, &got)
			if got.State != "running" || got.Metadata["user"] != meta["user"] || !strings.Contains(string(r.body), sb.EnvdAccessToken) {
				t.Fatalf("detail %s", r.body)
			}
			list := func(query string) []e2bListedOut {
				t.Helper()
				r := sdk(http.MethodGet, api+"/v2/sandboxes?"+query, key.Key, nil)
				wantStatus(t, "list "+query, r, http.StatusOK)
				var out []e2bListedOut
				r.decode(t, &out)
				return out
			}
			if l := list(sdkMetadataQuery("user", meta["user"]) + "&state=running&limit=10"); len(l) != 1 || l[0].SandboxID != sb.SandboxID {
				t.Fatalf("metadata filter: %+v", l)
			}
			if l := list(sdkMetadataQuery("user", "bob")); len(l) != 0 {
				t.Fatalf("a filter that matches nothing: %+v", l)
			}
			r = sdk(http.MethodPost, api+"/v2/sandboxes/"+sb.SandboxID+"/connect", key.Key, map[string]any{"timeout": 60})
			wantStatus(t, "connect to a running sandbox", r, http.StatusOK)
			var again e2bSandboxOut
			r.decode(t, &again)
			if again.EnvdAccessToken != sb.EnvdAccessToken || again.SandboxID != sb.SandboxID {
				t.Fatalf("connect answered %+v", again)
			}
			wantStatus(t, "timeout", sdk(http.MethodPost, api+"/sandboxes/"+sb.SandboxID+"/timeout", key.Key, map[string]any{"timeout": 3600}),
				http.StatusNoContent)
			sdk(http.MethodGet, api+"/sandboxes/"+sb.SandboxID, key.Key, nil).decode(t, &got)
			if time.Until(got.EndAt) < 50*time.Minute {
				t.Fatalf("endAt %s after a one-hour timeout", got.EndAt)
			}
			wantStatus(t, "timeout past a day", sdk(http.MethodPost, api+"/sandboxes/"+sb.SandboxID+"/timeout", key.Key, map[string]any{"timeout": 86401}),
				http.StatusBadRequest)
			wantStatus(t, "timeout without one", sdk(http.MethodPost, api+"/sandboxes/"+sb.SandboxID+"/timeout", key.Key, map[string]any{}),
				http.StatusBadRequest)
			wantStatus(t, "pause", sdk(http.MethodPost, api+"/sandboxes/"+sb.SandboxID+"/pause", key.Key, map[string]any{}), http.StatusNoContent)
			wantStatus(t, "pause again", sdk(http.MethodPost, api+"/sandboxes/"+sb.SandboxID+"/pause", key.Key, map[string]any{}), http.StatusConflict)
			if l := list("state=paused"); len(l) != 1 || l[0].State != "paused" {
				t.Fatalf("paused list: %+v", l)
			}
			wantStatus(t, "connect resumes", sdk(http.MethodPost, api+"/sandboxes/"+sb.SandboxID+"/connect", key.Key, map[string]any{"timeout": 60}),
				http.StatusCreated)
			wantStatus(t, "pause once more", sdk(http.MethodPost, api+"/sandboxes/"+sb.SandboxID+"/pause", key.Key, nil), http.StatusNoContent)
			wantStatus(t, "resume (older SDKs)", sdk(http.MethodPost, api+"/sandboxes/"+sb.SandboxID+"/resume", key.Key, map[string]any{"timeout": 60}),
				http.StatusCreated)
			wantStatus(t, "templates", sdk(http.MethodGet, api+"/templates", key.Key, nil), http.StatusOK)
			r = sdk(http.MethodPost, api+"/sandboxes/"+sb.SandboxID+"/fork", key.Key, map[string]any{"count": 1})
			wantStatus(t, "a call the console does not serve", r, http.StatusNotFound)
			e2bError(t, r)
		})

		t.Run("the data plane resolves the id and minted token, and nothing else", func(t *testing.T) {
			ctx := context.Background()
			b, err := e.c.E2B.ResolveSandbox(ctx, sb.SandboxID, sb.EnvdAccessToken)
			if err != nil {
				t.Fatal(err)
			}
			if b.Org.Slug != "acme" || b.SessionID == 0 || b.Actor == nil || b.Actor.KeyID != key.ID || b.Actor.UserID != f.ids["member"] {
				t.Fatalf("binding %+v", b)
			}
			b.Release()
			for name, c := range map[string][2]string{"wrong token": {sb.SandboxID, strings.Repeat("0", 64)}, "no token": {sb.SandboxID, ""},
				"unknown id": {"acme-0123456789abcdef", sb.EnvdAccessToken}, "another org": {"globex" + strings.TrimPrefix(sb.SandboxID, "acme"), sb.EnvdAccessToken},
				"not an id": {"../etc", sb.EnvdAccessToken}} {
				if _, err := e.c.E2B.ResolveSandbox(ctx, c[0], c[1]); !errors.Is(err, apperr.ErrUnauthorized) {
					t.Errorf("%s: %v, want the one unauthorized answer", name, err)
				}
			}
		})

		t.Run("another org's key, another agent's key and another key of the agent find nothing by id", func(t *testing.T) {
			// The sandbox's envd token acts as the key that created it:
			// a key of the same agent whose owner may see the session
			// (an admin) must not be handed it, or it would act in the
			// sandbox as that other key's owner.
			adminKey := mintE2BKey(t, e, "acme", f.tokens["admin"], agent, "admin runtime")
			for name, c := range map[string][2]string{"globex key, globex path": {"/e2b/orgs/globex", gkey.Key},
				"other agent's key": {api, otherKey.Key}, "another key of the agent": {api, adminKey.Key}} {
				for _, m := range []struct{ method, path string }{{http.MethodGet, ""}, {http.MethodDelete, ""}, {http.MethodPost, "/connect"},
					{http.MethodPost, "/pause"}, {http.MethodPost, "/timeout"}} {
					r := sdk(m.method, c[0]+"/sandboxes/"+sb.SandboxID+m.path, c[1], map[string]any{"timeout": 10})
					wantStatus(t, name+" "+m.method+m.path, r, http.StatusNotFound)
					e2bError(t, r)
				}
				r := sdk(http.MethodGet, c[0]+"/v2/sandboxes", c[1], nil)
				if strings.Contains(string(r.body), sb.SandboxID) {
					t.Errorf("%s lists the sandbox: %s", name, r.body)
				}
			}
		})

		var second e2bSandboxOut
		t.Run("kill closes the session; the id is then unknown", func(t *testing.T) {
			sdk(http.MethodPost, api+"/sandboxes", key.Key, map[string]any{"templateID": "base"}).decode(t, &second)
			var l []e2bListedOut
			sdk(http.MethodGet, api+"/v2/sandboxes", key.Key, nil).decode(t, &l)
			if len(l) != 2 || l[0].SandboxID != second.SandboxID || l[1].SandboxID != sb.SandboxID {
				t.Fatalf("list, newest first: %+v", l)
			}
			// Paged: the next page's token in X-Next-Token, none on the last.
			r := sdk(http.MethodGet, api+"/v2/sandboxes?limit=1", key.Key, nil)
			r.decode(t, &l)
			next := r.header.Get("X-Next-Token")
			if len(l) != 1 || l[0].SandboxID != second.SandboxID || next == "" {
				t.Fatalf("first page %+v, next token %q", l, next)
			}
			r = sdk(http.MethodGet, api+"/v2/sandboxes?limit=1&nextToken="+url.QueryEscape(next), key.Key, nil)
			r.decode(t, &l)
			if len(l) != 1 || l[0].SandboxID != sb.SandboxID || r.header.Get("X-Next-Token") != "" {
				t.Fatalf("last page %+v, next token %q", l, r.header.Get("X-Next-Token"))
			}
			r = sdk(http.MethodGet, api+"/v2/sandboxes?nextToken=not-a-token", key.Key, nil)
			wantStatus(t, "a bad nextToken", r, http.StatusBadRequest)
			_, msg := e2bError(t, r)
			mustContain(t, "bad nextToken", msg, "nextToken")
			wantStatus(t, "kill", sdk(http.MethodDelete, api+"/sandboxes/"+sb.SandboxID, key.Key, nil), http.StatusNoContent)
			wantStatus(t, "get after kill", sdk(http.MethodGet, api+"/sandboxes/"+sb.SandboxID, key.Key, nil), http.StatusNotFound)
			wantStatus(t, "kill again", sdk(http.MethodDelete, api+"/sandboxes/"+sb.SandboxID, key.Key, nil), http.StatusNotFound)
			if _, err := e.c.E2B.ResolveSandbox(context.Background(), sb.SandboxID, sb.EnvdAccessToken); err == nil {
				t.Error("a killed sandbox still resolves")
			}
		})

		t.Run("revoking the key refuses its next request and its sandboxes' data plane", func(t *testing.T) {
			b, err := e.c.E2B.ResolveSandbox(context.Background(), second.SandboxID, second.EnvdAccessToken)
			if err != nil {
				t.Fatal(err)
			}
			b.Release()
			// A command streaming through the data plane when the key is
			// revoked: its stream ends refused at its next poll, it does
			// not run on under the revoked key. (It would end by itself
			// after 120 lines; the 1 s keepalive makes each poll short.)
			proc := processconnect.NewProcessClient(http.DefaultClient, e.srv.URL, connect.WithProtoJSON(),
				connect.WithInterceptors(envdAuth{token: second.EnvdAccessToken, sandbox: second.SandboxID}))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := startCmd("for i in $(seq 1 120); do echo $i; sleep 1; done", false)
			req.Header().Set("Keepalive-Ping-Interval", "1")
			stream, err := proc.Start(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			defer stream.Close()
			for stream.Receive() {
				if stream.Msg().GetEvent().GetData() != nil {
					break // running, its output flowing
				}
			}
			// And input streaming into a command: its first line went
			// through (cat echoed it) before the key is revoked.
			cat := startedProcess(t, ctx, proc, startCmd("cat", true))
			sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: cat.Msg().GetEvent().GetStart().GetPid()}}
			line := func(s string) *process.StreamInputRequest {
				return &process.StreamInputRequest{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{
					Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(s)}}}}}
			}
			in := proc.StreamInput(ctx)
			in.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: sel}}})
			in.Send(line("before\n"))
			for cat.Receive() {
				if string(cat.Msg().GetEvent().GetData().GetStdout()) == "before\n" {
					break
				}
			}
			// And a quiet command streamed without keepalives, whose
			// poll waits up to 30 s for output: the revocation still ends
			// its stream at once (the watch rechecks every second), well
			// before the 20 s this stream is given.
			qctx, qcancel := context.WithTimeout(ctx, 20*time.Second)
			defer qcancel()
			quiet := startedProcess(t, qctx, proc, startCmd("sleep 120", false))
			wantStatus(t, "revoke another's key", e.json(http.MethodDelete, "/api/v1/orgs/acme/e2b-keys/"+itoa(key.ID), f.tokens["plain"], nil),
				http.StatusNotFound)
			wantStatus(t, "revoke", e.json(http.MethodDelete, "/api/v1/orgs/acme/e2b-keys/"+itoa(key.ID), f.tokens["member"], nil), http.StatusNoContent)
			r := sdk(http.MethodGet, api+"/sandboxes/"+second.SandboxID, key.Key, nil)
			wantStatus(t, "after revoke", r, http.StatusUnauthorized)
			e2bError(t, r)
			if _, err := e.c.E2B.ResolveSandbox(context.Background(), second.SandboxID, second.EnvdAccessToken); !errors.Is(err, apperr.ErrUnauthorized) {
				t.Errorf("the revoked key's sandbox still resolves: %v", err)
			}
			for stream.Receive() {
				if stream.Msg().GetEvent().GetEnd() != nil {
					t.Fatal("the command ran to its end after its key was revoked")
				}
			}
			wantCode(t, "the revoked key's open stream", stream.Err(), connect.CodeUnauthenticated)
			for quiet.Receive() {
				if quiet.Msg().GetEvent().GetEnd() != nil {
					t.Fatal("the quiet command ended after its key was revoked")
				}
			}
			wantCode(t, "the revoked key's quiet stream (no keepalives)", quiet.Err(), connect.CodeUnauthenticated)
			in.Send(line("after\n"))
			_, err = in.CloseAndReceive()
			wantCode(t, "the revoked key's open input stream", err, connect.CodeUnauthenticated)
		})

		t.Run("the audit log names the key's owner through the key", func(t *testing.T) {
			for _, action := range []string{"e2b_key.create", "session.create", "session.e2b_timeout", "session.pause", "session.close", "e2b_key.revoke"} {
				var out struct {
					Items []struct {
						Action  string `json:"action"`
						Actor   struct{ Type, ID string }
						Details json.RawMessage `json:"details"`
					} `json:"items"`
				}
				e.json(http.MethodGet, "/api/v1/orgs/acme/audit?q=action:"+action, f.tokens["admin"], nil).decode(t, &out)
				if len(out.Items) == 0 {
					t.Errorf("no %s event", action)
					continue
				}
				if action != "e2b_key.create" && action != "e2b_key.revoke" && (out.Items[0].Actor.Type != "api_key" || out.Items[0].Actor.ID != itoa(key.ID)) {
					t.Errorf("%s by %+v, want the e2b key", action, out.Items[0].Actor)
				}
				if strings.Contains(string(out.Items[0].Details), key.Key[16:]) {
					t.Errorf("%s records the key's secret", action)
				}
			}
		})

		t.Run("the envd token is sealed at rest", func(t *testing.T) {
			tn, err := e.c.Tenants.Open(context.Background(), "acme")
			if err != nil {
				t.Fatal(err)
			}
			defer tn.Release()
			x, err := e2b.Find(context.Background(), tn.DB, sb.SandboxID)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(x.TokenSealed, "v1:") || strings.Contains(x.TokenSealed, sb.EnvdAccessToken) {
				t.Fatalf("stored token %q", x.TokenSealed)
			}
		})

		t.Run("the backend's credentials and sandbox ids appear in no answer, page or log", func(t *testing.T) {
			page := e.do(request{method: http.MethodGet, path: "/o/acme/e2b", token: f.tokens["member"]})
			wantStatus(t, "endpoint page", page, http.StatusOK)
			answers = append(answers, string(page.body))
			var sess struct {
				Items []struct {
					SandboxID string `json:"sandbox_id"`
				} `json:"items"`
			}
			e.json(http.MethodGet, "/api/v1/orgs/acme/sessions", f.tokens["admin"], nil).decode(t, &sess)
			secrets := map[string]string{"backend API key": e2bfaketest.APIKey, "backend agentd token": e2bfaketest.Token}
			for _, x := range sess.Items {
				if x.SandboxID != "" {
					secrets["backend sandbox id "+x.SandboxID] = x.SandboxID
				}
			}
			if len(secrets) < 4 {
				t.Fatalf("expected backend sandbox ids to look for, got %v", secrets)
			}
			for name, s := range secrets {
				for _, a := range answers {
					if strings.Contains(a, s) {
						t.Errorf("an E2B answer holds the %s: %s", name, a)
					}
				}
			}
			logs := e.logs.String()
			for name, s := range map[string]string{"backend API key": e2bfaketest.APIKey, "e2b key": key.Key[16:], "envd token": sb.EnvdAccessToken} {
				if strings.Contains(logs, s) {
					t.Errorf("the console's log holds the %s", name)
				}
			}
		})
	})
}

// TestE2BEndpoint: the endpoint API gives the org's control-plane URL,
// the single-host data-plane URL and the configured domain; sandboxes
// created then answer that domain instead of the placeholder.
func TestE2BEndpoint(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d, func(c *config.Config) {
			c.E2BDomain, c.E2BPublicURL = "e2b.acme.test", "https://sbx.acme.test"
		})
		e := f.e
		r := e.json(http.MethodGet, "/api/v1/orgs/acme/e2b-endpoint", f.tokens["member"], nil)
		wantStatus(t, "endpoint", r, http.StatusOK)
		var ep e2b.Endpoint
		r.decode(t, &ep)
		if ep.APIURL != e.srv.URL+"/e2b/orgs/acme" || ep.SandboxURL != "https://sbx.acme.test" || ep.Domain != "e2b.acme.test" {
			t.Fatalf("endpoint %+v", ep)
		}
		wantStatus(t, "endpoint signed out", e.json(http.MethodGet, "/api/v1/orgs/acme/e2b-endpoint", "", nil), http.StatusUnauthorized)
		fake := e2bfaketest.New(t, agentdBin, e2bfake.Config{})
		agent := e2bSandboxAgent(t, e, fake, "acme", f.tokens["entered-admin"], f.dept1, "coder")
		key := mintE2BKey(t, e, "acme", f.tokens["member"], agent, "runtime")
		r = e.e2bSDK(http.MethodPost, "/e2b/orgs/acme/sandboxes", key.Key, map[string]any{"templateID": "base"})
		wantStatus(t, "create", r, http.StatusCreated)
		var sb e2bSandboxOut
		r.decode(t, &sb)
		if sb.Domain != "e2b.acme.test" {
			t.Fatalf("domain %q, want the configured one", sb.Domain)
		}
		wantStatus(t, "kill", e.e2bSDK(http.MethodDelete, "/e2b/orgs/acme/sandboxes/"+sb.SandboxID, key.Key, nil), http.StatusNoContent)
	})
}

// TestE2BKeyOfOwnerWhoLostAccess: a key acts as its owner, so once the
// owner may no longer see the key's agent (their department role was
// taken), the key reads nothing of the agent's template (no sizes in a
// get or list, no template list) and creates nothing, although the owner
// still sees the sessions they opened. Every refusal is in E2B's shape.
func TestE2BKeyOfOwnerWhoLostAccess(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := newOrgFixture(t, d)
		e := f.e
		fake := e2bfaketest.New(t, agentdBin, e2bfake.Config{})
		agent := e2bSandboxAgent(t, e, fake, "acme", f.tokens["entered-admin"], f.dept1, "coder")
		key := mintE2BKey(t, e, "acme", f.tokens["member"], agent, "runtime")
		api := "/e2b/orgs/acme"
		r := e.e2bSDK(http.MethodPost, api+"/sandboxes", key.Key, map[string]any{"templateID": "base"})
		wantStatus(t, "create while a member", r, http.StatusCreated)
		var sb e2bSandboxOut
		r.decode(t, &sb)
		wantStatus(t, "get while a member", e.e2bSDK(http.MethodGet, api+"/sandboxes/"+sb.SandboxID, key.Key, nil), http.StatusOK)

		r = e.json(http.MethodDelete, "/api/v1/orgs/acme/roles", f.tokens["entered-admin"], rbac.Assignment{
			Subject: fmt.Sprintf("user:%d", f.ids["member"]), Role: rbac.RoleMember, Domain: rbac.DeptDomain(f.dept1)})
		wantStatus(t, "take the member's role", r, http.StatusNoContent)
		r = e.json(http.MethodGet, "/api/v1/orgs/acme/sessions", f.tokens["member"], nil)
		wantStatus(t, "the owner's sessions", r, http.StatusOK)
		mustContain(t, "the owner still sees the session", string(r.body), `"agent_id":`+itoa(agent))

		for _, c := range []struct {
			name, method, path string
			body               any
		}{
			{"get", http.MethodGet, api + "/sandboxes/" + sb.SandboxID, nil},
			{"list", http.MethodGet, api + "/v2/sandboxes", nil},
			{"templates", http.MethodGet, api + "/templates", nil},
			{"create", http.MethodPost, api + "/sandboxes", map[string]any{"templateID": "base"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				r := e.e2bSDK(c.method, c.path, key.Key, c.body)
				wantStatus(t, c.name+" after the role was taken", r, http.StatusNotFound)
				e2bError(t, r)
				for _, leak := range []string{"cpuCount", "memoryMB", "diskSizeMB", sb.SandboxID} {
					if strings.Contains(string(r.body), leak) {
						t.Errorf("%s answers %s: %s", c.name, leak, r.body)
					}
				}
			})
		}
	})
}
