//go:build unix

package agentd_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/agentd/agentdtest"
)

func do(t *testing.T, method, url, token, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestAuth(t *testing.T) {
	t.Parallel()
	url, token := agentdtest.Start(t)
	tests := []struct {
		name   string
		method string
		path   string
		token  string
		status int
	}{
		{"health needs no token", "GET", "/healthz", "", 200},
		{"missing token", "POST", "/v1/files/stat", "", 401},
		{"wrong token", "POST", "/v1/files/stat", "nope", 401},
		{"token prefix", "POST", "/v1/files/stat", token[:len(token)-1], 401},
		{"right token", "POST", "/v1/files/stat", token, 200},
		{"unknown route without token", "GET", "/v2/x", "", 401},
		{"unknown route", "GET", "/v2/x", token, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			status, body := do(t, tt.method, url+tt.path, tt.token, `{"paths":[]}`)
			if status != tt.status {
				t.Fatalf("status %d; want %d (%s)", status, tt.status, body)
			}
			if status >= 400 {
				var env agentd.ErrorEnvelope
				if err := json.Unmarshal(body, &env); err != nil || env.Error.Code == "" || env.Error.Message == "" {
					t.Fatalf("not an error envelope: %s", body)
				}
			}
		})
	}
}

func TestMalformedRequests(t *testing.T) {
	t.Parallel()
	url, token := agentdtest.Start(t)
	tests := []struct {
		name   string
		method string
		path   string
		body   string
		status int
		code   string
	}{
		{"empty body", "POST", "/v1/sessions", "", 400, agentd.CodeMalformedJSON},
		{"not json", "POST", "/v1/sessions", "command=ls", 400, agentd.CodeMalformedJSON},
		{"array", "POST", "/v1/sessions", `["ls"]`, 400, agentd.CodeMalformedJSON},
		{"unknown field", "POST", "/v1/sessions", `{"command":"ls","shell":"bash"}`, 400, agentd.CodeMalformedJSON},
		{"wrong type", "POST", "/v1/sessions", `{"command":1}`, 400, agentd.CodeMalformedJSON},
		{"trailing data", "POST", "/v1/sessions", `{"command":"ls"} {}`, 400, agentd.CodeMalformedJSON},
		{"truncated", "POST", "/v1/sessions", `{"command":"ls"`, 400, agentd.CodeMalformedJSON},
		{"too large", "POST", "/v1/sessions", `{"command":"` + strings.Repeat("x", 2<<20) + `"}`, 413, agentd.CodeTooLarge},
		{"missing command", "POST", "/v1/sessions", `{}`, 400, agentd.CodeBadRequest},
		{"null body", "POST", "/v1/sessions", `null`, 400, agentd.CodeMalformedJSON},
		{"null stdin body", "POST", "/v1/sessions/nope/stdin", `null`, 404, agentd.CodeNotFound},
		{"null stat body", "POST", "/v1/files/stat", `null`, 400, agentd.CodeMalformedJSON},
		{"key in other case", "POST", "/v1/sessions", `{"COMMAND":"echo pwned"}`, 400, agentd.CodeMalformedJSON},
		{"key in mixed case", "POST", "/v1/sessions", `{"command":"true","Wait_MS":1}`, 400, agentd.CodeMalformedJSON},
		{"duplicate key", "POST", "/v1/sessions", `{"command":"true","command":"echo pwned"}`, 400, agentd.CodeMalformedJSON},
		{"duplicate env key", "POST", "/v1/sessions", `{"command":"true","env":{"A":"1","A":"2"}}`, 400, agentd.CodeMalformedJSON},
		{"duplicate stat key", "POST", "/v1/files/stat", `{"paths":[],"paths":["a"]}`, 400, agentd.CodeMalformedJSON},
		{"nested duplicate in array", "POST", "/v1/files/stat", `{"paths":[{"a":1,"a":2}]}`, 400, agentd.CodeMalformedJSON},
		{"negative timeout", "POST", "/v1/sessions", `{"command":"ls","timeout_ms":-1}`, 400, agentd.CodeBadRequest},
		{"huge rows", "POST", "/v1/sessions", `{"command":"ls","tty":true,"rows":65535}`, 400, agentd.CodeBadRequest},
		{"rows overflow", "POST", "/v1/sessions", `{"command":"ls","rows":70000}`, 400, agentd.CodeMalformedJSON},
		{"bad env", "POST", "/v1/sessions", `{"command":"ls","env":{"A=B":"c"}}`, 400, agentd.CodeBadRequest},
		{"bad overflow", "POST", "/v1/sessions", `{"command":"ls","overflow":"explode"}`, 400, agentd.CodeBadRequest},
		{"NUL in command", "POST", "/v1/sessions", `{"command":"ls\u0000"}`, 400, agentd.CodeBadRequest},
		{"wrong method", "PUT", "/v1/sessions", `{}`, 405, agentd.CodeMethodNotAllowed},
		{"unknown session", "GET", "/v1/sessions/nope", "", 404, agentd.CodeNotFound},
		{"unknown session stdin", "POST", "/v1/sessions/nope/stdin", `{"text":"x"}`, 404, agentd.CodeNotFound},
		{"unknown session delete", "DELETE", "/v1/sessions/nope", "", 404, agentd.CodeNotFound},
		{"bad base64 stdin", "POST", "/v1/sessions/nope/stdin", `{"data":"!!"}`, 404, agentd.CodeNotFound},
		{"stat not a list", "POST", "/v1/files/stat", `{"paths":"a"}`, 400, agentd.CodeMalformedJSON},
		{"stat too many", "POST", "/v1/files/stat", `{"paths":[` + strings.Repeat(`"a",`, 2000) + `"a"]}`, 400, agentd.CodeBadRequest},
		{"fetch no url", "POST", "/v1/files/fetch", `{"path":"x"}`, 400, agentd.CodeBadRequest},
		{"fetch bad url", "POST", "/v1/files/fetch", `{"url":"::","path":"x"}`, 400, agentd.CodeBadRequest},
		{"fetch negative max", "POST", "/v1/files/fetch", `{"url":"http://x","path":"x","max_bytes":-5}`, 400, agentd.CodeBadRequest},
		{"file no path", "GET", "/v1/files", "", 400, agentd.CodeBadRequest},
		{"file bad offset", "GET", "/v1/files?path=x&offset=-1", "", 400, agentd.CodeBadRequest},
		{"file huge limit", "GET", "/v1/files?path=x&limit=99999999999", "", 400, agentd.CodeBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			status, body := do(t, tt.method, url+tt.path, token, tt.body)
			var env agentd.ErrorEnvelope
			if err := json.Unmarshal(body, &env); err != nil {
				t.Fatalf("status %d, body is not JSON: %.200s", status, body)
			}
			if status != tt.status || env.Error.Code != tt.code {
				t.Fatalf("got %d %q (%s); want %d %q", status, env.Error.Code, env.Error.Message, tt.status, tt.code)
			}
		})
	}
}

func TestSessionPollQueryErrors(t *testing.T) {
	t.Parallel()
	url, token := agentdtest.Start(t)
	c := agentd.NewClient(url, token, nil)
	resp, err := c.CreateSession(testCtx(t), agentd.CreateSessionRequest{Command: "echo x", WaitMS: 5000})
	if err != nil {
		t.Fatal(err)
	}
	base := url + "/v1/sessions/" + resp.SessionID
	tests := []struct {
		name, method, path, body string
		status                   int
	}{
		{"negative cursor", "GET", "?cursor=-1", "", 400},
		{"text cursor", "GET", "?cursor=abc", "", 400},
		{"cursor ahead", "GET", "?cursor=99", "", 400},
		{"huge wait", "GET", "?wait_ms=999999999999999999999", "", 400},
		{"ack_to past the cursor", "GET", "?cursor=0&ack_to=1", "", 400},
		{"ack_to without ack", "GET", "?cursor=1&ack=false&ack_to=1", "", 400},
		{"text ack_to", "GET", "?cursor=1&ack_to=x", "", 400},
		{"ack_to at the cursor", "GET", "?cursor=1&ack_to=1", "", 200},
		{"resize zero", "POST", "/resize", `{"rows":0,"cols":0}`, 400},
		{"resize non-tty", "POST", "/resize", `{"rows":10,"cols":10}`, 409},
		{"stdin both", "POST", "/stdin", `{"data":"eA==","text":"x"}`, 400},
		{"stdin bad base64", "POST", "/stdin", `{"data":"!!"}`, 400},
		{"stdin after exit", "POST", "/stdin", `{"text":"x"}`, 409},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			status, body := do(t, tt.method, base+tt.path, token, tt.body)
			if status != tt.status {
				t.Fatalf("status %d; want %d (%s)", status, tt.status, body)
			}
		})
	}
}

func TestClientHeadersAndTransport(t *testing.T) {
	t.Parallel()
	url, token := agentdtest.Start(t)
	var seen []string
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen = append(seen, r.Header.Get("E2b-Traffic-Access-Token"))
		return http.DefaultTransport.RoundTrip(r)
	})
	c := agentd.NewClient(url, token, &http.Client{Transport: rt}, agentd.WithHeader("e2b-traffic-access-token", "tat"))
	if _, err := c.Health(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0] != "tat" {
		t.Fatalf("headers seen by the transport: %q", seen)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestPollJSONAndBinaryAgree(t *testing.T) {
	t.Parallel()
	url, token := agentdtest.Start(t)
	c := agentd.NewClient(url, token, nil)
	resp, err := c.CreateSession(testCtx(t), agentd.CreateSessionRequest{
		Command: "printf 'a\\0b'; sleep 0.02; printf err >&2; exit 4", WaitMS: 5000,
	})
	if err != nil {
		t.Fatal(err)
	}
	binResp, err := c.Poll(testCtx(t), resp.SessionID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	status, body := do(t, "GET", url+"/v1/sessions/"+resp.SessionID+"?cursor=0", token, "")
	var jsonResp agentd.SessionResponse
	if err := json.Unmarshal(body, &jsonResp); err != nil || status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	a, _ := json.Marshal(binResp)
	b, _ := json.Marshal(jsonResp)
	if string(a) != string(b) {
		t.Fatalf("binary %s\njson   %s", a, b)
	}
	if len(jsonResp.Chunks) != 2 || jsonResp.Chunks[0].Stream != "stdout" || string(jsonResp.Chunks[0].Data) != "a\x00b" || jsonResp.Chunks[1].Stream != "stderr" || *jsonResp.ExitCode != 4 {
		t.Fatalf("unexpected response %s", b)
	}
}

func TestWantsChunks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		accept string
		want   bool
	}{
		{"", false},
		{"application/json", false},
		{agentd.ChunksMediaType, true},
		{"application/json, " + agentd.ChunksMediaType, true},
		{agentd.ChunksMediaType + ";q=0.5", true},
		{agentd.ChunksMediaType + ";q=0", false},
		{agentd.ChunksMediaType + "; q=0.0, application/json", false},
		{"application/x-agentd-chunksx", false},
	}
	for _, tt := range tests {
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		if tt.accept != "" {
			r.Header.Set("Accept", tt.accept)
		}
		if got := agentd.WantsChunks(r); got != tt.want {
			t.Errorf("Accept %q: WantsChunks = %v, want %v", tt.accept, got, tt.want)
		}
	}
}
