package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gatehouse/gatehouse/internal/clip"
)

// chaosClient is the driver's HTTP client of the console replicas, through
// the balancer. It retries what the docs say to retry and keeps every
// answer that was not a success, for the end of the run to judge against
// the faults injected at that time.
type chaosClient struct {
	base string
	hc   *http.Client

	requests atomic.Int64 // sent
	served   atomic.Int64 // answered 2xx
	retries  atomic.Int64 // connection refused, reset or cut: sent again

	mu     sync.Mutex
	errors []answerRecord
}

// answerRecord is one non-2xx answer the driver saw.
type answerRecord struct {
	At     time.Time
	Org    string
	Env    string // the environment the request was about, if any
	Method string
	Path   string
	Status int
	Code   string
	Body   string
}

// errAmbiguous says a request that must not be sent twice (an exec, a
// stdin write) got no answer: it may or may not have taken effect.
var errAmbiguous = errors.New("no answer: the request may or may not have taken effect")

// apiError is a non-2xx answer the caller did not accept.
type apiError struct {
	Status int
	Code   string
	Body   string
}

func (e *apiError) Error() string { return fmt.Sprintf("status %d %s: %s", e.Status, e.Code, e.Body) }

// request is one call of the console's API.
type request struct {
	method, path, token string
	body                any
	// org and env name what the request is about, for judging its errors.
	org, env string
	// once marks requests that must not be sent twice (exec, stdin): a
	// transport failure returns errAmbiguous instead of retrying.
	once bool
	// accept lists error codes the caller handles itself: they are
	// returned as *apiError without being recorded.
	accept []string
	// retryOn lists statuses retried (recorded) until the deadline;
	// retrySuspended retries 403 org_suspended and 401 credential_revoked.
	retryOn        []int
	retrySuspended bool
}

// maxOpTime bounds how long one operation retries before the run calls it
// stuck.
const maxOpTime = 3 * time.Minute

// do sends r until it gets an answer it returns, retrying as r says. out
// receives a 2xx JSON answer; raw, when out is nil, is the body.
func (c *chaosClient) do(ctx context.Context, r request, out any) ([]byte, error) {
	deadline := time.Now().Add(maxOpTime)
	backoff := 100 * time.Millisecond
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		status, body, err := c.send(ctx, r)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if r.once {
				return nil, errAmbiguous
			}
			c.retries.Add(1)
		} else if status/100 == 2 {
			c.served.Add(1)
			if out != nil {
				if err := json.Unmarshal(body, out); err != nil {
					return body, fmt.Errorf("%s %s: decode %.200s: %w", r.method, r.path, body, err)
				}
			}
			return body, nil
		} else {
			code := errorCode(body)
			for _, a := range r.accept {
				if a == code {
					return body, &apiError{Status: status, Code: code, Body: string(body)}
				}
			}
			c.record(r, status, code, body)
			retry := slices.Contains(r.retryOn, status) || (r.retrySuspended && (code == "org_suspended" || code == "credential_revoked"))
			if !retry {
				return body, &apiError{Status: status, Code: code, Body: string(body)}
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s %s: no success within %s", r.method, r.path, maxOpTime)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		backoff = min(backoff*2, time.Second)
	}
}

// send makes one attempt; err is a transport failure.
func (c *chaosClient) send(ctx context.Context, r request) (int, []byte, error) {
	var body io.Reader
	if r.body != nil {
		b, err := json.Marshal(r.body)
		if err != nil {
			return 0, nil, err
		}
		body = bytes.NewReader(b)
	}
	// A poll waits up to its wait_ms; anything else answers in seconds
	// unless something is wrong, which the retry then sees.
	rctx, cancel := context.WithTimeout(ctx, 75*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, r.method, c.base+r.path, body)
	if err != nil {
		return 0, nil, err
	}
	if r.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	c.requests.Add(1)
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		// The console died while answering.
		return 0, nil, err
	}
	return resp.StatusCode, b, nil
}

func (c *chaosClient) record(r request, status int, code string, body []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errors = append(c.errors, answerRecord{At: time.Now(), Org: r.org, Env: r.env, Method: r.method, Path: r.path,
		Status: status, Code: code, Body: clip.String(string(body), 300)})
}

func (c *chaosClient) answers() []answerRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]answerRecord(nil), c.errors...)
}

// errorCode is the code of the console's error envelope, or "".
func errorCode(body []byte) string {
	var env struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &env) != nil {
		return ""
	}
	return env.Error.Code
}

// isCode reports whether err is an answer with code.
func isCode(err error, code string) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.Code == code
}

// window is a span of time during which a fault was in effect.
type window struct {
	kind       string // "db_cut", "db_refuse", "agentd_restart", "org_suspended", "console_kill"
	target     string // the env, org or replica it hit
	start, end time.Time
}

// covers reports whether at falls in w, extended by grace after its end
// (caches and retries need a moment to see the fault is over).
func (w window) covers(at time.Time, grace time.Duration) bool {
	return !at.Before(w.start) && (w.end.IsZero() || !at.After(w.end.Add(grace)))
}

// judge sorts the driver's error answers into documented ones (the fault
// in effect at the time explains them, as the docs say) and the rest.
func judge(answers []answerRecord, windows []window) (documented map[string]int, undocumented []answerRecord) {
	documented = map[string]int{}
	const grace = 10 * time.Second
	for _, a := range answers {
		why := ""
		for _, w := range windows {
			if !w.covers(a.At, grace) {
				continue
			}
			switch {
			case w.kind == "db_cut" && a.Status == http.StatusServiceUnavailable &&
				(a.Code == "database_unavailable" || a.Code == "audit_unavailable"):
				why = "503 " + a.Code + " during the database cut"
			case w.kind == "db_refuse" && a.Org == w.target && a.Status == http.StatusServiceUnavailable &&
				(a.Code == "database_unavailable" || a.Code == "audit_unavailable"):
				why = "503 " + a.Code + " while the org's database refused connections"
			case w.kind == "agentd_restart" && a.Env == w.target && a.Status == http.StatusBadGateway && a.Code == "environment_unreachable":
				why = "502 environment_unreachable while agentd restarted"
			case w.kind == "console_kill" && a.Status == http.StatusBadGateway && strings.Contains(a.Body, "has not started in its environment yet"):
				why = "502 for a command whose create died with its killed replica"
			case w.kind == "console_kill" && a.Status == http.StatusServiceUnavailable && a.Code == "database_unavailable" &&
				strings.Contains(a.Body, "The console is starting"):
				why = "503 from the restarted replica while it started"
			case w.kind == "org_suspended" && a.Org == w.target && (a.Code == "org_suspended" || a.Code == "credential_revoked"):
				why = fmt.Sprintf("%d %s while the org was suspended", a.Status, a.Code)
			}
			if why != "" {
				break
			}
		}
		if why == "" {
			undocumented = append(undocumented, a)
			continue
		}
		documented[why]++
	}
	return documented, undocumented
}

// describe is one line about an answer.
func (a answerRecord) describe(t0 time.Time) string {
	return fmt.Sprintf("t+%.1fs %s %s (org %s, env %s): %d %s %s", a.At.Sub(t0).Seconds(), a.Method, a.Path, a.Org, a.Env,
		a.Status, a.Code, strings.TrimSpace(a.Body))
}
