package apidoc_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/apidoc"
)

// kindStatus is the status internal/handlers (errors.go, statusOf) gives
// each apperr kind answered 4xx.
var kindStatus = map[string]int{
	"ErrInvalid": 400, "ErrUnauthorized": 401, "ErrForbidden": 403, "ErrSuspended": 403,
	"ErrNotFound": 404, "ErrConflict": 409, "ErrTooMany": 429,
}

// notInTheAPI are 4xx codes built in the code that no operation of this
// document answers, each with where it is answered instead.
var notInTheAPI = map[string]string{
	"invalid_access_token":  "the E2B data plane (internal/e2b, envd's API)",
	"sandbox_not_found":     "the E2B endpoints (internal/e2b)",
	"not_served":            "the E2B data plane (internal/e2b)",
	"port_not_served":       "the E2B data plane (internal/e2b)",
	"too_many_streams":      "the E2B data plane (internal/e2b)",
	"file_too_large":        "the E2B data plane (internal/e2b)",
	"already_paused":        "the E2B control plane (internal/e2b, ControlPlane)",
	"cross_origin":          "the terminal's WebSocket handshake (a page route)",
	"access_removed":        "the terminal's WebSocket, when access ends while it is open",
	"sign_in_race":          "the SSO callback page",
	"no_such_admin":         "the console's admin recovery command",
	"approval_not_runnable": "the gateway's start of an approved command (internal/approvals, SetCommand)",
	"not_found":             "listed; also the pages' and /docs' unknown addresses",
}

var (
	newCode   = regexp.MustCompile(`apperr\.New\(apperr\.(Err[A-Za-z]+),\s*("([a-z_]+)"|([A-Za-z]+))\s*,`)
	literal   = regexp.MustCompile(`apperr\.Error\{Kind:\s*apperr\.(Err[A-Za-z]+),\s*Code:\s*"([a-z_]+)"`)
	constCode = regexp.MustCompile(`(?m)^\s*([A-Za-z]+)\s*=\s*"([a-z_]+)"`)
)

// builtCodes are the codes apperr.New is called with (or an apperr.Error
// literal holds) in the non-test Go files under internal/, with the status their kind is answered with, and
// where. A code named by a constant is resolved in its file's package; a
// code put together ("session_"+state) or passed on (agentd's) is not
// seen here.
func builtCodes(t *testing.T) map[string]map[int][]string {
	t.Helper()
	out := map[string]map[int][]string{}
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range literal.FindAllStringSubmatch(string(b), -1) {
			if status, ok := kindStatus[m[1]]; ok {
				if out[m[2]] == nil {
					out[m[2]] = map[int][]string{}
				}
				out[m[2]][status] = append(out[m[2]][status], path)
			}
		}
		for _, m := range newCode.FindAllStringSubmatch(string(b), -1) {
			status, ok := kindStatus[m[1]]
			if !ok {
				continue // answered 5xx
			}
			code := m[3]
			if code == "" {
				if code = packageConst(t, filepath.Dir(path), m[4]); code == "" {
					continue // a code passed on (agentd's, a variable)
				}
			}
			if out[code] == nil {
				out[code] = map[int][]string{}
			}
			out[code][status] = append(out[code][status], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func packageConst(t *testing.T, dir, name string) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range constCode.FindAllStringSubmatch(string(b), -1) {
			if m[1] == name {
				return m[2]
			}
		}
	}
	return ""
}

// Every 4xx code the code builds is listed, with its status, by some
// operation of the document, or is answered only outside the JSON API
// (notInTheAPI); and each operation lists its codes (issue 35, item 7).
// Which operation answers which code is checked on real traffic: the
// handler tests validate every answer against the operation's list.
func TestEveryBuiltCodeIsDocumented(t *testing.T) {
	doc, err := apidoc.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]map[int]bool{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			codes := apidoc.Codes(op)
			if len(codes) == 0 {
				t.Errorf("%s %s lists no error codes", method, path)
			}
			if op.Responses.Value("4XX") != nil {
				t.Errorf("%s %s keeps a blanket 4XX answer", method, path)
			}
			for status, cs := range codes {
				for _, c := range cs {
					if documented[c] == nil {
						documented[c] = map[int]bool{}
					}
					documented[c][status] = true
				}
			}
		}
	}
	built := builtCodes(t)
	if len(built) < 50 {
		t.Fatalf("found only %d codes in the source; the scan is broken", len(built))
	}
	var problems []string
	for code, statuses := range built {
		if _, elsewhere := notInTheAPI[code]; elsewhere && len(documented[code]) == 0 {
			continue
		}
		for status, where := range statuses {
			if !documented[code][status] {
				if _, elsewhere := notInTheAPI[code]; elsewhere {
					continue
				}
				problems = append(problems, fmt.Sprintf("%d %s (built in %s)", status, code, strings.Join(slices.Compact(where), ", ")))
			}
		}
	}
	slices.Sort(problems)
	for _, p := range problems {
		t.Errorf("no operation of openapi.yaml lists %s", p)
	}
	for code := range notInTheAPI {
		if built[code] == nil {
			t.Errorf("notInTheAPI names %s, which the code no longer builds", code)
		}
	}
}
