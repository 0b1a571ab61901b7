package e2bfake_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
)

// raw sends a request with an exact body and content type, and returns the
// status and decoded JSON (or the text when it is not JSON).
func raw(t *testing.T, method, u, contentType, body string) (int, http.Header, any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", e2bfaketest.APIKey)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		v = string(b)
	}
	return resp.StatusCode, resp.Header, v
}

// wantErrorShape checks E2B's error body {code, message}.
func wantErrorShape(t *testing.T, what string, status int, v any) {
	t.Helper()
	m, _ := v.(map[string]any)
	if code, _ := m["code"].(float64); int(code) != status {
		t.Errorf("%s: error body %v, want code %d", what, v, status)
	}
	if msg, _ := m["message"].(string); msg == "" {
		t.Errorf("%s: error body %v has no message", what, v)
	}
}

func newID(t *testing.T, u, body string) string {
	t.Helper()
	st, _, v := raw(t, "POST", u+"/sandboxes", "application/json", body)
	if st != http.StatusCreated {
		t.Fatalf("create %s: %d %v", body, st, v)
	}
	return v.(map[string]any)["sandboxID"].(string)
}

// TestRefusesWhatE2BRefuses: every request E2B's spec validation or
// handlers refuse is 400 with {code, message} here too, and the nearest
// valid request is accepted, so the refusal is for the stated reason.
func TestRefusesWhatE2BRefuses(t *testing.T) {
	t.Parallel()
	e2b := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
	cube := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}, CubeSandbox: true})
	running := newID(t, e2b.URL(), `{"templateID":"base","timeout":300}`)
	cubeRunning := newID(t, cube.URL(), `{"templateID":"base"}`)
	const js = "application/json"
	tests := []struct {
		name         string
		f            *e2bfake.Server
		method, path string
		ct, body     string
		want         int
	}{
		{"create: text/plain", e2b, "POST", "/sandboxes", "text/plain", `{"templateID":"base"}`, 400},
		{"create: no content type", e2b, "POST", "/sandboxes", "", `{"templateID":"base"}`, 400},
		{"create: json with charset", e2b, "POST", "/sandboxes", "application/json; charset=utf-8", `{"templateID":"base"}`, 201},
		{"create: no body", e2b, "POST", "/sandboxes", js, ``, 400},
		{"create: not an object", e2b, "POST", "/sandboxes", js, `["base"]`, 400},
		{"create: broken JSON", e2b, "POST", "/sandboxes", js, `{"templateID":`, 400},
		{"create: templateID missing", e2b, "POST", "/sandboxes", js, `{"timeout":30}`, 400},
		{"create: templateID not a string", e2b, "POST", "/sandboxes", js, `{"templateID":7}`, 400},
		{"create: unknown template", e2b, "POST", "/sandboxes", js, `{"templateID":"nosuch"}`, 404},
		{"create v2: timeout 0", e2b, "POST", "/v2/sandboxes", js, `{"templateID":"base","timeout":0}`, 400},
		{"create: timeout -1 at E2B", e2b, "POST", "/sandboxes", js, `{"templateID":"base","timeout":-1}`, 400},
		{"create: timeout -1 at CubeSandbox", cube, "POST", "/sandboxes", js, `{"templateID":"base","timeout":-1}`, 201},
		{"create: timeout -2 at CubeSandbox", cube, "POST", "/sandboxes", js, `{"templateID":"base","timeout":-2}`, 400},
		{"create: timeout 1", e2b, "POST", "/sandboxes", js, `{"templateID":"base","timeout":1}`, 201},
		{"create: timeout a string", e2b, "POST", "/sandboxes", js, `{"templateID":"base","timeout":"60"}`, 400},
		{"create: timeout a fraction", e2b, "POST", "/sandboxes", js, `{"templateID":"base","timeout":1.5}`, 400},
		{"create: timeout over int32", e2b, "POST", "/sandboxes", js, `{"templateID":"base","timeout":2147483648}`, 400},
		{"create: autoPause not a bool", e2b, "POST", "/sandboxes", js, `{"templateID":"base","autoPause":"yes"}`, 400},
		{"create: autoResume without enabled", e2b, "POST", "/sandboxes", js, `{"templateID":"base","autoResume":{}}`, 400},
		{"create: autoResume enabled", e2b, "POST", "/sandboxes", js, `{"templateID":"base","autoResume":{"enabled":true}}`, 201},
		{"create: null env var", e2b, "POST", "/sandboxes", js, `{"templateID":"base","envVars":{"A":null}}`, 400},
		{"create: env var a number", e2b, "POST", "/sandboxes", js, `{"templateID":"base","envVars":{"A":1}}`, 400},
		{"create: null metadata value", e2b, "POST", "/sandboxes", js, `{"templateID":"base","metadata":{"a":null}}`, 400},
		{"create: private without secure", e2b, "POST", "/sandboxes", js, `{"templateID":"base","network":{"allowPublicTraffic":false}}`, 400},
		{"create: private and secure", e2b, "POST", "/sandboxes", js, `{"templateID":"base","secure":true,"network":{"allowPublicTraffic":false}}`, 201},
		{"create: bad lifecycle at CubeSandbox", cube, "POST", "/sandboxes", js, `{"templateID":"base","lifecycle":{"onTimeout":"explode"}}`, 400},
		{"create: lifecycle is ignored at E2B", e2b, "POST", "/sandboxes", js, `{"templateID":"base","lifecycle":{"onTimeout":"explode"}}`, 201},
		{"pause: memory not a bool", e2b, "POST", "/sandboxes/" + running + "/pause", js, `{"memory":"yes"}`, 400},
		{"pause: body not JSON", e2b, "POST", "/sandboxes/" + running + "/pause", "text/plain", `memory`, 400},
		{"connect: no body", e2b, "POST", "/sandboxes/" + running + "/connect", js, ``, 400},
		{"connect: timeout missing", e2b, "POST", "/sandboxes/" + running + "/connect", js, `{}`, 400},
		{"connect: timeout -1 at E2B", e2b, "POST", "/sandboxes/" + running + "/connect", js, `{"timeout":-1}`, 400},
		{"connect: wrong content type", e2b, "POST", "/v2/sandboxes/" + running + "/connect", "application/x-www-form-urlencoded", `timeout=30`, 400},
		{"connect: timeout 0", e2b, "POST", "/sandboxes/" + running + "/connect", js, `{"timeout":0}`, 200},
		{"timeout: -5", e2b, "POST", "/sandboxes/" + running + "/timeout", js, `{"timeout":-5}`, 400},
		{"timeout: -1 at E2B", e2b, "POST", "/sandboxes/" + running + "/timeout", js, `{"timeout":-1}`, 400},
		{"timeout: -1 at CubeSandbox", cube, "POST", "/sandboxes/" + cubeRunning + "/timeout", js, `{"timeout":-1}`, 204},
		{"list: unknown order", e2b, "GET", "/v2/sandboxes?order=sideways", "", "", 400},
		{"list: order asc", e2b, "GET", "/v2/sandboxes?order=asc", "", "", 200},
		{"list: startedAfter not a date-time", e2b, "GET", "/v2/sandboxes?startedAfter=yesterday", "", "", 400},
		{"list: startedAfter without zone", e2b, "GET", "/v2/sandboxes?startedAfter=2026-01-02T03:04:05", "", "", 400},
		{"list: startedAfter RFC 3339", e2b, "GET", "/v2/sandboxes?startedAfter=2026-01-02T03%3A04%3A05Z", "", "", 200},
		{"list: unknown state", e2b, "GET", "/v2/sandboxes?state=running,dead", "", "", 400},
		{"list: limit 0", e2b, "GET", "/v2/sandboxes?limit=0", "", "", 400},
		{"list: limit 101", e2b, "GET", "/v2/sandboxes?limit=101", "", "", 400},
		{"list: metadata without =", e2b, "GET", "/v2/sandboxes?metadata=abc", "", "", 400},
		{"list: metadata with a bare %", e2b, "GET", "/v2/sandboxes?metadata=" + url.QueryEscape("a=%zz"), "", "", 400},
		{"list: garbage nextToken", e2b, "GET", "/v2/sandboxes?nextToken=%21%21", "", "", 400},
		{"list v1: bad metadata", e2b, "GET", "/sandboxes?metadata=abc", "", "", 400},
		{"unknown route", e2b, "GET", "/v3/nothing", "", "", 404},
		{"unknown method", e2b, "PUT", "/templates", js, `{}`, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, _, v := raw(t, tt.method, tt.f.URL()+tt.path, tt.ct, tt.body)
			if st != tt.want {
				t.Fatalf("%s %s %s = %d %v, want %d", tt.method, tt.path, tt.body, st, v, tt.want)
			}
			if st >= 400 {
				wantErrorShape(t, tt.name, st, v)
			}
		})
	}
}

// TestEnvdTokenOnlyWhenSecure: E2B returns envdAccessToken for secure
// sandboxes only; a private one carries a traffic token.
func TestEnvdTokenOnlyWhenSecure(t *testing.T) {
	t.Parallel()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
	tests := []struct {
		body                  string
		wantEnvd, wantTraffic bool
	}{
		{`{"templateID":"base"}`, false, false},
		{`{"templateID":"base","secure":false}`, false, false},
		{`{"templateID":"base","secure":true}`, true, false},
		{`{"templateID":"base","secure":true,"network":{"allowPublicTraffic":false}}`, true, true},
	}
	for _, tt := range tests {
		st, _, v := raw(t, "POST", f.URL()+"/sandboxes", "application/json", tt.body)
		if st != http.StatusCreated {
			t.Fatalf("create %s: %d %v", tt.body, st, v)
		}
		m := v.(map[string]any)
		if _, has := m["envdAccessToken"]; has != tt.wantEnvd {
			t.Errorf("%s: envdAccessToken present = %v, want %v", tt.body, has, tt.wantEnvd)
		}
		if tok, _ := m["trafficAccessToken"].(string); (tok != "") != tt.wantTraffic {
			t.Errorf("%s: trafficAccessToken = %v", tt.body, m["trafficAccessToken"])
		}
		_, _, d := raw(t, "GET", f.URL()+"/sandboxes/"+m["sandboxID"].(string), "", "")
		if _, has := d.(map[string]any)["envdAccessToken"]; has != tt.wantEnvd {
			t.Errorf("%s: detail envdAccessToken present = %v, want %v", tt.body, has, tt.wantEnvd)
		}
	}
}

// TestTemplateWithBuilds: GET /templates/{id} is E2B's TemplateWithBuilds,
// with sizes inside builds rather than at the top level.
func TestTemplateWithBuilds(t *testing.T) {
	t.Parallel()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{},
		Templates: []e2bfake.Template{{ID: "tpl1", Aliases: []string{"py"}, CPU: 4, MemoryMB: 2048, DiskSizeMB: 8192}}})
	for _, ref := range []string{"tpl1", "py"} {
		st, _, v := raw(t, "GET", f.URL()+"/templates/"+ref, "", "")
		if st != http.StatusOK {
			t.Fatalf("GET /templates/%s: %d %v", ref, st, v)
		}
		hasKeys(t, "TemplateWithBuilds", v, "templateID", "public", "aliases", "names", "createdAt", "updatedAt", "lastSpawnedAt", "spawnCount", "builds")
		m := v.(map[string]any)
		if _, has := m["cpuCount"]; has {
			t.Errorf("TemplateWithBuilds has a top-level cpuCount: %v", m)
		}
		builds, _ := m["builds"].([]any)
		if len(builds) != 1 {
			t.Fatalf("builds = %v", m["builds"])
		}
		hasKeys(t, "TemplateBuild", builds[0], "buildID", "status", "createdAt", "updatedAt", "cpuCount", "memoryMB", "diskSizeMB", "envdVersion")
		b := builds[0].(map[string]any)
		if b["cpuCount"] != float64(4) || b["memoryMB"] != float64(2048) || b["status"] != "ready" || len(b["buildID"].(string)) != 36 {
			t.Errorf("build = %v", b)
		}
	}
}

// TestMetadataFilterDecoding: the filter is decoded in E2B's steps, so
// only the SDKs' double encoding finds a value holding & or =.
func TestMetadataFilterDecoding(t *testing.T) {
	t.Parallel()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
	id := newID(t, f.URL(), `{"templateID":"base","metadata":{"agent":"y & z=1","org":"acme"}}`)
	tests := []struct {
		name, rawQuery string
		want           int // sandboxes found; -1 for a 400
	}{
		// What the JS SDK sends for {agent: "y & z=1"}.
		{"SDK encoding", "metadata=agent%3Dy%252520%252526%252520z%25253D1", 1},
		{"SDK encoding, two pairs", "metadata=agent%3Dy%252520%252526%252520z%25253D1%26org%3Dacme", 1},
		{"plain pair", "metadata=" + url.QueryEscape("org=acme"), 1},
		{"one layer too few breaks on &", "metadata=" + url.QueryEscape(url.Values{"agent": {"y & z=1"}}.Encode()), 0},
		{"unencoded = in a value is refused", "metadata=" + url.QueryEscape("agent=a=b"), -1},
		{"wrong value", "metadata=" + url.QueryEscape("org=globex"), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, _, v := raw(t, "GET", f.URL()+"/v2/sandboxes?"+tt.rawQuery, "", "")
			if tt.want < 0 {
				if st != http.StatusBadRequest {
					t.Fatalf("status %d %v, want 400", st, v)
				}
				return
			}
			list, _ := v.([]any)
			if st != http.StatusOK || len(list) != tt.want {
				t.Fatalf("status %d, %d sandboxes (%v); want %d", st, len(list), v, tt.want)
			}
			if tt.want == 1 && list[0].(map[string]any)["sandboxID"] != id {
				t.Errorf("found %v, want %s", list[0], id)
			}
		})
	}
}

func listIDs(t *testing.T, u string) ([]string, string) {
	t.Helper()
	st, h, v := raw(t, "GET", u, "", "")
	if st != http.StatusOK {
		t.Fatalf("GET %s: %d %v", u, st, v)
	}
	var ids []string
	for _, it := range v.([]any) {
		ids = append(ids, it.(map[string]any)["sandboxID"].(string))
	}
	return ids, h.Get("X-Next-Token")
}

// TestListOrderFiltersAndPaging: newest first by default, order=asc,
// template and startedAfter filters, and X-Next-Token paging in both
// orders.
func TestListOrderFiltersAndPaging(t *testing.T) {
	t.Parallel()
	clock := e2bfaketest.NewManualClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}, Clock: clock.Now, Templates: []e2bfake.Template{
		{ID: "tpl-a", Aliases: []string{"alpha"}, CPU: 1, MemoryMB: 256},
		{ID: "tpl-b", CPU: 1, MemoryMB: 256},
	}})
	var ids []string
	var starts []time.Time
	for i, tpl := range []string{"alpha", "tpl-b", "tpl-a", "tpl-b"} {
		starts = append(starts, f.Now())
		ids = append(ids, newID(t, f.URL(), `{"templateID":"`+tpl+`","timeout":3600,"metadata":{"n":"`+string(rune('0'+i))+`"}}`))
		f.Advance(time.Minute)
	}
	newest := slices.Clone(ids)
	slices.Reverse(newest)
	after := url.QueryEscape(starts[1].Format(time.RFC3339))
	tests := []struct {
		query string
		want  []string
	}{
		{"", newest},
		{"order=desc", newest},
		{"order=asc", ids},
		{"template=tpl-a", []string{ids[2], ids[0]}},
		{"template=alpha", []string{ids[2], ids[0]}},
		{"template=tpl-b&order=asc", []string{ids[1], ids[3]}},
		{"startedAfter=" + after, []string{ids[3], ids[2]}},
		{"startedAfter=" + after + "&template=tpl-b", []string{ids[3]}},
	}
	for _, tt := range tests {
		if got, _ := listIDs(t, f.URL()+"/v2/sandboxes?"+tt.query); !slices.Equal(got, tt.want) {
			t.Errorf("?%s = %v, want %v", tt.query, got, tt.want)
		}
	}
	for _, order := range []string{"desc", "asc"} {
		want := newest
		if order == "asc" {
			want = ids
		}
		var got []string
		tok := ""
		for range 10 {
			u := f.URL() + "/v2/sandboxes?limit=3&order=" + order
			if tok != "" {
				u += "&nextToken=" + url.QueryEscape(tok)
			}
			var page []string
			page, tok = listIDs(t, u)
			got = append(got, page...)
			if tok == "" {
				break
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("paged %s = %v, want %v", order, got, want)
		}
	}
	// A token is a position, not a snapshot: killing the page's last
	// sandbox does not lose the next one.
	page, tok := listIDs(t, f.URL()+"/v2/sandboxes?limit=2")
	if st, _, _ := raw(t, "DELETE", f.URL()+"/sandboxes/"+page[1], "", ""); st != http.StatusNoContent {
		t.Fatalf("kill: %d", st)
	}
	if rest, _ := listIDs(t, f.URL()+"/v2/sandboxes?limit=2&nextToken="+url.QueryEscape(tok)); !slices.Equal(rest, newest[2:]) {
		t.Errorf("page after a kill = %v, want %v", rest, newest[2:])
	}
}

// TestIgnoreNextToken: CubeSandbox sends X-Next-Token but answers the
// first page whatever token comes back.
func TestIgnoreNextToken(t *testing.T) {
	t.Parallel()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}, CubeSandbox: true})
	if _, err := f.Seed(make([]e2bfake.SeedSandbox, 3)...); err != nil {
		t.Fatal(err)
	}
	first, tok := listIDs(t, f.URL()+"/v2/sandboxes?limit=2")
	if len(first) != 2 || tok == "" {
		t.Fatalf("first page %v, token %q", first, tok)
	}
	again, _ := listIDs(t, f.URL()+"/v2/sandboxes?limit=2&nextToken="+url.QueryEscape(tok))
	if !slices.Equal(first, again) {
		t.Errorf("second page %v, want the first again %v", again, first)
	}
	if bad, _ := listIDs(t, f.URL()+"/v2/sandboxes?nextToken=garbage"); len(bad) != 3 {
		t.Errorf("garbage token with IgnoreNextToken: %v", bad)
	}
}

// TestPauseConnectTimeout: pause is 204 then 409; a paused sandbox reports
// endAt as the pause time and refuses set-timeout (404, as at E2B);
// connect resumes with 201 (200 at CubeSandbox) and only extends a running
// sandbox's timeout; timeouts pause or kill per autoPause.
func TestPauseConnectTimeout(t *testing.T) {
	t.Parallel()
	for _, cube := range []bool{false, true} {
		start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		clock := e2bfaketest.NewManualClock(start)
		f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}, Clock: clock.Now, CubeSandbox: cube})
		u := f.URL()
		detail := func(id string) map[string]any {
			st, _, v := raw(t, "GET", u+"/sandboxes/"+id, "", "")
			if st != http.StatusOK {
				t.Fatalf("detail %s: %d %v", id, st, v)
			}
			return v.(map[string]any)
		}
		id := newID(t, u, `{"templateID":"base","timeout":60}`)
		f.Advance(10 * time.Second)
		steps := []struct {
			path, body string
			want       int
		}{
			{"/pause", "", 204},
			{"/pause", "", 409},
			{"/timeout", `{"timeout":60}`, 404},
		}
		for _, s := range steps {
			if st, _, v := raw(t, "POST", u+"/sandboxes/"+id+s.path, "application/json", s.body); st != s.want {
				t.Fatalf("cube=%v POST %s = %d %v, want %d", cube, s.path, st, v, s.want)
			}
		}
		d := detail(id)
		if d["state"] != "paused" || d["endAt"] != start.Add(10*time.Second).Format(time.RFC3339Nano) {
			t.Errorf("cube=%v paused detail state %v endAt %v, want paused at %v", cube, d["state"], d["endAt"], start.Add(10*time.Second))
		}
		f.Advance(time.Hour) // a paused sandbox does not time out
		wantResume := 201
		if cube {
			wantResume = 200
		}
		if st, _, v := raw(t, "POST", u+"/sandboxes/"+id+"/connect", "application/json", `{"timeout":120}`); st != wantResume {
			t.Fatalf("cube=%v connect paused = %d %v, want %d", cube, st, v, wantResume)
		}
		end := f.Now().Add(120 * time.Second).Format(time.RFC3339Nano)
		if d := detail(id); d["state"] != "running" || d["endAt"] != end {
			t.Errorf("cube=%v after connect: %v %v, want running until %v", cube, d["state"], d["endAt"], end)
		}
		// Connect never shortens a running sandbox's timeout.
		if st, _, _ := raw(t, "POST", u+"/sandboxes/"+id+"/connect", "application/json", `{"timeout":5}`); st != 200 {
			t.Fatalf("cube=%v connect running = %d", cube, st)
		}
		if d := detail(id); d["endAt"] != end {
			t.Errorf("cube=%v connect shortened endAt to %v", cube, d["endAt"])
		}

		auto := newID(t, u, `{"templateID":"base","timeout":30,"autoPause":true}`)
		killed := newID(t, u, `{"templateID":"base","timeout":30}`)
		f.Advance(31 * time.Second)
		if d := detail(auto); d["state"] != "paused" {
			t.Errorf("cube=%v autoPause sandbox after timeout: %v", cube, d["state"])
		}
		if st, _, _ := raw(t, "GET", u+"/sandboxes/"+killed, "", ""); st != 404 {
			t.Errorf("cube=%v sandbox without autoPause after timeout: %d, want 404", cube, st)
		}
		if st, _, _ := raw(t, "DELETE", u+"/sandboxes/"+auto, "", ""); st != 204 {
			t.Errorf("cube=%v kill paused: %d", cube, st)
		}
	}
}

// TestFaults drives every kind of injected fault over real HTTP.
func TestFaults(t *testing.T) {
	t.Parallel()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
	u := f.URL()
	create := func(hc *http.Client, md string) (int, http.Header, []byte, error) {
		req, _ := http.NewRequest("POST", u+"/sandboxes", strings.NewReader(`{"templateID":"base","metadata":{"k":"`+md+`"}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-API-Key", e2bfaketest.APIKey)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, nil, nil, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b, nil
	}
	count := func(md string) int {
		ids, _ := listIDs(t, u+"/v2/sandboxes?metadata="+url.QueryEscape("k="+md))
		return len(ids)
	}
	short := &http.Client{Timeout: 300 * time.Millisecond}
	tests := []struct {
		name        string
		fault       e2bfake.Fault
		hc          *http.Client
		wantStatus  int // 0: the client gets no answer
		wantBody    string
		wantRetry   string
		wantCreated int
	}{
		{"500", e2bfake.Fault{Route: "POST /sandboxes", Status: 500}, http.DefaultClient, 500, `"code":500`, "", 0},
		{"503 with Retry-After", e2bfake.Fault{Route: "POST /sandboxes", Status: 503, RetryAfter: 1500 * time.Millisecond}, http.DefaultClient, 503, `"code":503`, "2", 0},
		{"malformed body, not created", e2bfake.Fault{Status: 200, Body: `{"sandboxID":`}, http.DefaultClient, 200, `{"sandboxID":`, "", 0},
		{"created, answer malformed", e2bfake.Fault{Route: "POST /sandboxes", Body: `<html>oops</html>`, AfterHandler: true}, http.DefaultClient, 201, `<html>`, "", 1},
		{"created, answer replaced by 502", e2bfake.Fault{Route: "POST /sandboxes", Status: 502, AfterHandler: true}, http.DefaultClient, 502, `"code":502`, "", 1},
		{"created, answer never arrives", e2bfake.Fault{Route: "POST /sandboxes", Hang: true, AfterHandler: true}, short, 0, "", "", 1},
		{"slow, client gives up first, not created", e2bfake.Fault{Route: "POST /sandboxes", Delay: time.Minute}, short, 0, "", "", 0},
		{"other route unaffected", e2bfake.Fault{Route: "GET /templates", Status: 500}, http.DefaultClient, 201, `"sandboxID"`, "", 1},
	}
	for i, tt := range tests {
		md := "fault-" + string(rune('a'+i))
		remove := f.InjectFault(tt.fault)
		st, h, body, err := create(tt.hc, md)
		remove()
		if tt.wantStatus == 0 {
			if err == nil {
				t.Errorf("%s: got %d %s, want no answer", tt.name, st, body)
			}
		} else if err != nil || st != tt.wantStatus || !bytes.Contains(body, []byte(tt.wantBody)) {
			t.Errorf("%s: %d %s %v, want %d with %s", tt.name, st, body, err, tt.wantStatus, tt.wantBody)
		}
		if tt.wantRetry != "" && h.Get("Retry-After") != tt.wantRetry {
			t.Errorf("%s: Retry-After %q, want %q", tt.name, h.Get("Retry-After"), tt.wantRetry)
		}
		if n := count(md); n != tt.wantCreated {
			t.Errorf("%s: %d sandboxes created, want %d", tt.name, n, tt.wantCreated)
		}
	}

	// Times limits a fault to that many calls; ClearFaults removes all.
	f.InjectFault(e2bfake.Fault{Route: "GET /templates", Status: 503, Times: 2})
	f.InjectFault(e2bfake.Fault{Route: "GET /templates", Status: 500})
	var got []int
	for range 3 {
		st, _, _ := raw(t, "GET", u+"/templates", "", "")
		got = append(got, st)
	}
	f.ClearFaults()
	st, _, _ := raw(t, "GET", u+"/templates", "", "")
	if got = append(got, st); !slices.Equal(got, []int{503, 503, 500, 200}) {
		t.Errorf("statuses = %v, want 503 503 500 200", got)
	}
}

// TestSeed: seeded sandboxes are cheap records that list, page, pause,
// connect and die like created ones, with the states and times asked for.
func TestSeed(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := e2bfaketest.NewManualClock(start)
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}, Clock: clock.Now})
	specs := make([]e2bfake.SeedSandbox, 1000)
	for i := range specs {
		specs[i] = e2bfake.SeedSandbox{Metadata: map[string]string{"gatehouse.org": "acme"}, State: sandbox.StatePaused,
			StartedAt: start.Add(-time.Duration(i+2) * time.Hour), EndAt: start.Add(-time.Duration(i+1) * time.Hour)}
	}
	ids, err := f.Seed(specs...)
	if err != nil || len(ids) != 1000 {
		t.Fatalf("seed: %d ids, %v", len(ids), err)
	}
	if _, err := f.Seed(e2bfake.SeedSandbox{TemplateID: "nosuch"}); err == nil {
		t.Error("seeding an unknown template succeeded")
	}
	var all []string
	tok, pages := "", 0
	for {
		u := f.URL() + "/v2/sandboxes?state=paused&metadata=" + url.QueryEscape("gatehouse.org=acme")
		if tok != "" {
			u += "&nextToken=" + url.QueryEscape(tok)
		}
		var page []string
		page, tok = listIDs(t, u)
		all, pages = append(all, page...), pages+1
		if tok == "" {
			break
		}
	}
	if len(all) != 1000 || pages != 10 || all[0] != ids[0] || all[999] != ids[999] {
		t.Fatalf("listed %d in %d pages (first %s last %s)", len(all), pages, all[0], all[len(all)-1])
	}
	_, _, v := raw(t, "GET", f.URL()+"/sandboxes/"+ids[5], "", "")
	d := v.(map[string]any)
	if d["state"] != "paused" || d["endAt"] != start.Add(-6*time.Hour).Format(time.RFC3339Nano) {
		t.Errorf("seeded detail = %v", d)
	}
	if st, _, _ := raw(t, "POST", f.URL()+"/sandboxes/"+ids[5]+"/connect", "application/json", `{"timeout":60}`); st != 201 {
		t.Errorf("connect seeded: %d", st)
	}
	if st, _, _ := raw(t, "GET", f.ProxyURL()+"/sandbox/"+ids[5]+"/49984/", "", ""); st != http.StatusBadGateway {
		t.Errorf("proxy to a seeded sandbox answered %d, want 502", st)
	}
	if st, _, _ := raw(t, "DELETE", f.URL()+"/sandboxes/"+ids[5], "", ""); st != 204 {
		t.Errorf("kill seeded: %d", st)
	}
	running, err := f.Seed(e2bfake.SeedSandbox{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f.Advance(31 * time.Second)
	if _, ok := f.Inspect(running[0]); ok {
		t.Error("seeded running sandbox survived its timeout")
	}
}

// TestNextTokenIsOpaque keeps the token URL-safe, as E2B's is, so clients
// need not care how it is built.
func TestNextTokenIsOpaque(t *testing.T) {
	t.Parallel()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfake.NopLauncher{}})
	if _, err := f.Seed(make([]e2bfake.SeedSandbox, 2)...); err != nil {
		t.Fatal(err)
	}
	_, tok := listIDs(t, f.URL()+"/v2/sandboxes?limit=1")
	if _, err := base64.RawURLEncoding.DecodeString(tok); err != nil || url.QueryEscape(tok) != tok {
		t.Errorf("token %q is not URL-safe base64", tok)
	}
}
