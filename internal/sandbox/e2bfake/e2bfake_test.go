package e2bfake_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
)

var agentdBin e2bfaketest.Binary

func TestMain(m *testing.M) {
	e2bfaketest.Main(m, func(b e2bfaketest.Binary) { agentdBin = b })
}

// call sends a raw API request and decodes a JSON answer into a map (or a
// list for arrays).
func call(t *testing.T, hc *http.Client, method, url, key string, body any, hdr ...string) (int, http.Header, any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v any
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &v); err != nil {
			v = string(raw)
		}
	}
	return resp.StatusCode, resp.Header, v
}

func keys(v any) []string {
	m, _ := v.(map[string]any)
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func hasKeys(t *testing.T, what string, v any, want ...string) {
	t.Helper()
	got := keys(v)
	for _, k := range want {
		if !slices.Contains(got, k) {
			t.Errorf("%s: field %q missing (have %v)", what, k, got)
		}
	}
}

// TestWireShapes checks paths, status codes and field names against the
// published API, independently of the client.
func TestWireShapes(t *testing.T) {
	t.Parallel()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfaketest.StubLauncher{}})
	hc := &http.Client{Timeout: 10 * time.Second}
	u, k := f.URL(), e2bfaketest.APIKey

	st, _, v := call(t, hc, "POST", u+"/sandboxes", k, map[string]any{
		"templateID": "base", "timeout": 60, "metadata": map[string]string{"a": "1"}, "envVars": map[string]string{"X": "y"}, "secure": true,
	})
	if st != http.StatusCreated {
		t.Fatalf("create: %d %v", st, v)
	}
	hasKeys(t, "Sandbox", v, "sandboxID", "templateID", "clientID", "envdVersion", "envdAccessToken", "domain", "trafficAccessToken")
	id := v.(map[string]any)["sandboxID"].(string)

	st, _, v = call(t, hc, "POST", u+"/v2/sandboxes", k, map[string]any{"templateID": "base"})
	if st != http.StatusCreated {
		t.Fatalf("create v2: %d %v", st, v)
	}
	id2 := v.(map[string]any)["sandboxID"].(string)

	st, _, v = call(t, hc, "GET", u+"/sandboxes/"+id, k, nil)
	if st != http.StatusOK {
		t.Fatalf("detail: %d %v", st, v)
	}
	hasKeys(t, "SandboxDetail", v, "sandboxID", "templateID", "clientID", "startedAt", "endAt", "cpuCount", "memoryMB",
		"diskSizeMB", "state", "envdVersion", "metadata", "envdAccessToken", "domain", "lifecycle")
	d := v.(map[string]any)
	start, err1 := time.Parse(time.RFC3339, d["startedAt"].(string))
	end, err2 := time.Parse(time.RFC3339, d["endAt"].(string))
	if err1 != nil || err2 != nil || end.Sub(start) != time.Minute {
		t.Errorf("startedAt %v endAt %v: want RFC 3339, 60 s apart (%v %v)", d["startedAt"], d["endAt"], err1, err2)
	}
	if lc, _ := d["lifecycle"].(map[string]any); lc["onTimeout"] != "kill" || lc["autoResume"] != false {
		t.Errorf("lifecycle = %v", d["lifecycle"])
	}

	st, _, v = call(t, hc, "GET", u+"/v2/sandboxes", k, nil)
	if list, _ := v.([]any); st != http.StatusOK || len(list) != 2 {
		t.Fatalf("list v2: %d %v", st, v)
	} else {
		hasKeys(t, "ListedSandbox", list[0], "sandboxID", "templateID", "clientID", "startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "state", "envdVersion")
	}
	st, _, v = call(t, hc, "GET", u+"/sandboxes?metadata=a%3D1", k, nil)
	if list, _ := v.([]any); st != http.StatusOK || len(list) != 1 {
		t.Errorf("list v1 by metadata: %d %v", st, v)
	}

	steps := []struct {
		method, path string
		body         any
		want         int
	}{
		{"POST", "/sandboxes/" + id + "/pause", nil, 204},
		{"POST", "/sandboxes/" + id + "/pause", nil, 409},
		{"POST", "/v2/sandboxes/" + id + "/connect", map[string]any{"timeout": 30}, 201},
		{"POST", "/sandboxes/" + id + "/connect", map[string]any{"timeout": 30}, 200},
		{"POST", "/sandboxes/" + id + "/connect", map[string]any{}, 400},
		{"POST", "/sandboxes/" + id + "/resume", map[string]any{"timeout": 30}, 409},
		{"POST", "/sandboxes/" + id + "/timeout", map[string]any{"timeout": 120}, 204},
		{"POST", "/sandboxes/" + id + "/timeout", map[string]any{}, 400},
		{"GET", "/sandboxes/nosuch", nil, 404},
		{"POST", "/sandboxes/nosuch/pause", nil, 404},
		{"DELETE", "/sandboxes/" + id2, nil, 204},
		{"DELETE", "/sandboxes/" + id2, nil, 404},
		{"GET", "/sandboxes/" + id2, nil, 404},
		{"POST", "/sandboxes", map[string]any{}, 400},
		{"GET", "/v2/sandboxes?limit=0", nil, 400},
		{"GET", "/v2/sandboxes?state=dead", nil, 400},
	}
	for _, s := range steps {
		st, _, v := call(t, hc, s.method, u+s.path, k, s.body)
		if st != s.want {
			t.Errorf("%s %s = %d %v, want %d", s.method, s.path, st, v, s.want)
			continue
		}
		if st >= 400 {
			m, _ := v.(map[string]any)
			if code, _ := m["code"].(float64); int(code) != st || m["message"] == "" {
				t.Errorf("%s %s error body = %v, want {code:%d,message}", s.method, s.path, v, st)
			}
		}
	}

	for _, tc := range []struct{ name, key string }{{"missing", ""}, {"wrong", "nope"}} {
		st, _, v := call(t, hc, "GET", u+"/v2/sandboxes", tc.key, nil)
		m, _ := v.(map[string]any)
		if st != http.StatusUnauthorized || m["code"] != float64(401) {
			t.Errorf("%s key: %d %v, want 401 with code", tc.name, st, v)
		}
	}
	// Bearer is accepted too (CubeSandbox).
	if st, _, _ := call(t, hc, "GET", u+"/templates", "", nil, "Authorization", "Bearer "+k); st != http.StatusOK {
		t.Errorf("bearer auth: %d", st)
	}
	if st, _, v := call(t, hc, "GET", u+"/health", "", nil); st != http.StatusOK || v.(map[string]any)["status"] != "ok" {
		t.Errorf("health: %d %v", st, v)
	}
	st, _, v = call(t, hc, "GET", u+"/templates", k, nil)
	if list, _ := v.([]any); st != http.StatusOK || len(list) != 1 {
		t.Fatalf("templates: %d %v", st, v)
	} else {
		hasKeys(t, "Template", list[0], "templateID", "buildID", "cpuCount", "memoryMB", "diskSizeMB", "public", "aliases",
			"createdAt", "updatedAt", "buildStatus", "envdVersion")
	}

	for route, want := range map[string]int{
		"POST /sandboxes": 2, "POST /v2/sandboxes": 1, "POST /sandboxes/{sandboxID}/pause": 3,
		"POST /v2/sandboxes/{sandboxID}/connect": 1, "DELETE /sandboxes/{sandboxID}": 2, "GET /health": 1,
	} {
		if got := f.Calls(route); got != want {
			t.Errorf("Calls(%q) = %d, want %d", route, got, want)
		}
	}
}

func TestProxy(t *testing.T) {
	t.Parallel()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfaketest.StubLauncher{}})
	api := &http.Client{Timeout: 10 * time.Second}
	hc := f.HTTPClient()
	k := e2bfaketest.APIKey
	create := func(body map[string]any) map[string]any {
		body["templateID"] = "base"
		st, _, v := call(t, api, "POST", f.URL()+"/sandboxes", k, body)
		if st != http.StatusCreated {
			t.Fatalf("create: %d %v", st, v)
		}
		return v.(map[string]any)
	}
	open := create(map[string]any{})
	openID := open["sandboxID"].(string)
	if open["trafficAccessToken"] != nil {
		t.Errorf("public sandbox has a traffic token: %v", open["trafficAccessToken"])
	}
	private := create(map[string]any{"network": map[string]any{"allowPublicTraffic": false}, "secure": true})
	privID := private["sandboxID"].(string)
	token, _ := private["trafficAccessToken"].(string)
	if token == "" {
		t.Fatal("private sandbox has no traffic token")
	}
	resuming := create(map[string]any{"autoResume": map[string]any{"enabled": true}})
	resID := resuming["sandboxID"].(string)
	for _, id := range []string{openID, resID} {
		if st, _, _ := call(t, api, "POST", f.URL()+"/sandboxes/"+id+"/pause", k, nil); st != 204 {
			t.Fatalf("pause %s: %d", id, st)
		}
	}
	pausedOpen := openID
	open2 := create(map[string]any{})["sandboxID"].(string)

	tests := []struct {
		name     string
		url      string
		hdr      []string
		want     int
		wantBody string
	}{
		{"host-based", f.SandboxURL(open2, sandbox.AgentdPort) + "/v1/x?y=1", nil, 200, "stub " + open2 + " /v1/x"},
		{"path-based", f.ProxyURL() + "/sandbox/" + open2 + "/49984/v1/x", nil, 200, "stub " + open2 + " /v1/x"},
		{"path-based root", f.ProxyURL() + "/sandbox/" + open2 + "/49984", nil, 200, "stub " + open2 + " /"},
		{"other port", f.SandboxURL(open2, 8080) + "/", nil, 502, ""},
		{"unknown sandbox", f.SandboxURL("nosuch", sandbox.AgentdPort) + "/", nil, 502, ""},
		{"paused refuses", f.SandboxURL(pausedOpen, sandbox.AgentdPort) + "/", nil, 502, ""},
		{"paused auto-resumes", f.SandboxURL(resID, sandbox.AgentdPort) + "/v1/y", nil, 200, "stub " + resID + " /v1/y"},
		{"token missing", f.SandboxURL(privID, sandbox.AgentdPort) + "/", nil, 403, ""},
		{"token wrong", f.SandboxURL(privID, sandbox.AgentdPort) + "/", []string{"e2b-traffic-access-token", "nope"}, 403, ""},
		{"token given", f.SandboxURL(privID, sandbox.AgentdPort) + "/z", []string{"e2b-traffic-access-token", token}, 200, "stub " + privID + " /z"},
		{"cube token header", f.SandboxURL(privID, sandbox.AgentdPort) + "/z", []string{"cube-traffic-access-token", token}, 200, "stub " + privID + " /z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, _, v := call(t, hc, "GET", tt.url, "", nil, tt.hdr...)
			if st != tt.want {
				t.Fatalf("GET %s = %d %v, want %d", tt.url, st, v, tt.want)
			}
			if tt.wantBody != "" && v != tt.wantBody {
				t.Errorf("body = %v, want %q", v, tt.wantBody)
			}
			if st >= 400 {
				if m, _ := v.(map[string]any); m["code"] != float64(st) || !strings.Contains(strings.ToLower(m["message"].(string)), "sandbox") && tt.name != "other port" {
					t.Errorf("proxy error body = %v", v)
				}
			}
		})
	}
	if snap, _ := f.Inspect(resID); snap.State != sandbox.StateRunning {
		t.Errorf("auto-resumed sandbox state = %s, want running", snap.State)
	}
	if snap, _ := f.Inspect(pausedOpen); snap.State != sandbox.StatePaused {
		t.Errorf("refused sandbox state = %s, want paused", snap.State)
	}
	if n := f.Calls("PROXY"); n != len(tests) {
		t.Errorf("PROXY calls = %d, want %d", n, len(tests))
	}
}

// TestTimeoutZeroAndNever runs in CubeSandbox mode, where -1 is never and
// lifecycle decides what a timeout does.
func TestTimeoutZeroAndNever(t *testing.T) {
	t.Parallel()
	f := e2bfaketest.New(t, agentdBin, e2bfake.Config{Launcher: e2bfaketest.StubLauncher{}, CubeSandbox: true})
	api := &http.Client{Timeout: 10 * time.Second}
	k := e2bfaketest.APIKey
	mk := func(body map[string]any) string {
		st, _, v := call(t, api, "POST", f.URL()+"/sandboxes", k, body)
		if st != http.StatusCreated {
			t.Fatalf("create: %d %v", st, v)
		}
		return v.(map[string]any)["sandboxID"].(string)
	}
	never := mk(map[string]any{"templateID": "base", "timeout": -1})
	paused := mk(map[string]any{"templateID": "base", "timeout": 15, "lifecycle": map[string]any{"onTimeout": "pause", "autoResume": false}})
	gone := mk(map[string]any{"templateID": "base", "timeout": 15})

	// CubeSandbox's -1 never expires and has no endAt.
	_, _, v := call(t, api, "GET", f.URL()+"/sandboxes/"+never, k, nil)
	if _, has := v.(map[string]any)["endAt"]; has {
		t.Errorf("never-expiring sandbox has endAt: %v", v)
	}
	f.Advance(16 * time.Second)
	if s, ok := f.Inspect(never); !ok || s.State != sandbox.StateRunning {
		t.Errorf("never-expiring sandbox = %+v, %v", s, ok)
	}
	if s, ok := f.Inspect(paused); !ok || s.State != sandbox.StatePaused {
		t.Errorf("lifecycle pause sandbox = %+v, %v; want paused", s, ok)
	}
	if _, ok := f.Inspect(gone); ok {
		t.Error("default sandbox survived its timeout")
	}
	// timeout 0 expires now.
	if st, _, _ := call(t, api, "POST", f.URL()+"/sandboxes/"+never+"/timeout", k, map[string]any{"timeout": 0}); st != 204 {
		t.Fatalf("timeout 0: %d", st)
	}
	if _, ok := f.Inspect(never); ok {
		t.Error("sandbox survived timeout 0")
	}
}
