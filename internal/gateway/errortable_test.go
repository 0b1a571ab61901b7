package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/apidoc"
	"github.com/gatehouse/gatehouse/internal/apperr"
)

// kindStatus is the status internal/handlers (errors.go, statusOf) gives
// each apperr kind.
var kindStatus = map[error]int{
	apperr.ErrInvalid: 400, apperr.ErrUnauthorized: 401, apperr.ErrForbidden: 403, apperr.ErrSuspended: 403,
	apperr.ErrNotFound: 404, apperr.ErrConflict: 409, apperr.ErrTooMany: 429,
	apperr.ErrUpstream: 502, apperr.ErrUnavailable: 503,
}

func statusOfKind(t *testing.T, err error) int {
	t.Helper()
	for kind, status := range kindStatus {
		if errors.Is(err, kind) {
			return status
		}
	}
	t.Fatalf("%v has no kind", err)
	return 0
}

// gatewayOperations are the OpenAPI operations the gateway serves.
var gatewayOperations = []string{"execCommand", "listCommands", "killCommand", "pollOutput", "writeStdin",
	"resizeCommand", "readFile", "writeFile", "statFiles", "fetchFile"}

// consoleServerErrors are the 5xx codes of the console's edge, answered on
// every route the gateway serves (internal/handlers: a database outage,
// and anything unforeseen).
var consoleServerErrors = map[string]int{"database_unavailable": 503, "internal": 500}

type statusCodes map[string]map[int]bool

func (s statusCodes) add(code string, status int) {
	if s[code] == nil {
		s[code] = map[int]bool{}
	}
	s[code][status] = true
}

func (s statusCodes) String() string {
	var out []string
	for _, code := range slices.Sorted(maps.Keys(s)) {
		for _, st := range slices.Sorted(maps.Keys(s[code])) {
			out = append(out, fmt.Sprintf("%d %s", st, code))
		}
	}
	return strings.Join(out, ", ")
}

// errorTable reads the status and codes of each row of the Errors table
// of docs/terminal-gateway.md.
func errorTable(t *testing.T) statusCodes {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "terminal-gateway.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Errors\n")
	if !ok {
		t.Fatal("docs/terminal-gateway.md has no Errors section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile(`(?m)^\| (\d{3}) \| ([^|]+) \|`)
	code := regexp.MustCompile("`([a-z_]+)`")
	out := statusCodes{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		status, _ := strconv.Atoi(m[1])
		for _, c := range code.FindAllStringSubmatch(m[2], -1) {
			out.add(c[1], status)
		}
	}
	if len(out) == 0 {
		t.Fatal("the Errors table of docs/terminal-gateway.md has no rows")
	}
	return out
}

// serverErrorsBuilt are the codes built with a 5xx kind in the gateway and
// in the sessions package, whose lifecycle the gateway runs on first use.
func serverErrorsBuilt(t *testing.T) statusCodes {
	t.Helper()
	build := regexp.MustCompile(`apperr\.New\(apperr\.(ErrUpstream|ErrUnavailable),\s*"([a-z_]+)"\s*,`)
	out := statusCodes{}
	for _, dir := range []string{".", filepath.Join("..", "sessions")} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range build.FindAllStringSubmatch(string(b), -1) {
				out.add(m[2], map[string]int{"ErrUpstream": 502, "ErrUnavailable": 503}[m[1]])
			}
		}
	}
	return out
}

// neverForwarded are agentd's codes of requests no gateway operation
// forwards.
var neverForwarded = map[string]string{
	agentd.CodeAlreadyRekeyed:  "POST /v1/token, sent by the sessions package when a sandbox starts",
	agentd.CodeUsedBeforeRekey: "POST /v1/token, sent by the sessions package when a sandbox starts",
}

// agentdPassedOn is each code agentd answers with, as the gateway passes
// it on (agentdAnswer), with its status; agentd's own failures become
// environment_unreachable.
func agentdPassedOn(t *testing.T) statusCodes {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "agentd", "errors.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := statusCodes{}
	for _, m := range regexp.MustCompile(`(?m)^\s*Code[A-Za-z]+\s*=\s*"([a-z_]+)"`).FindAllStringSubmatch(string(b), -1) {
		if _, ok := neverForwarded[m[1]]; ok {
			continue
		}
		ae := &agentd.Error{Status: agentd.StatusOf(m[1]), Code: m[1], Message: "m"}
		answer, _ := agentdAnswer(ae, false)
		var shown *apperr.Error
		if !errors.As(answer, &shown) {
			t.Fatalf("agentd's %s is answered %v", m[1], answer)
		}
		out.add(shown.Code, statusOfKind(t, answer))
	}
	if len(out) < 15 {
		t.Fatalf("found only %d agentd codes; the scan is broken", len(out))
	}
	return out
}

// TestErrorTableListsEveryCode: docs/terminal-gateway.md's error table
// lists every code the gateway answers, with its status, and nothing
// else (issue 35). What it answers is: the codes the OpenAPI document
// lists for the gateway's operations (which the handler tests check on
// every answer they get), agentd's refusals passed on, and the server
// errors built here, in the lifecycle the gateway runs and at the
// console's edge.
func TestErrorTableListsEveryCode(t *testing.T) {
	doc, err := apidoc.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	documented := statusCodes{}
	found := 0
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			if !slices.Contains(gatewayOperations, op.OperationID) {
				continue
			}
			found++
			for status, codes := range apidoc.Codes(op) {
				for _, c := range codes {
					documented.add(c, status)
				}
			}
		}
	}
	if found != len(gatewayOperations) {
		t.Fatalf("found %d of the gateway's %d operations in the document", found, len(gatewayOperations))
	}
	passed := agentdPassedOn(t)
	want := statusCodes{}
	for _, from := range []statusCodes{documented, passed, serverErrorsBuilt(t)} {
		for code, statuses := range from {
			for st := range statuses {
				want.add(code, st)
			}
		}
	}
	for code, st := range consoleServerErrors {
		want.add(code, st)
	}

	table := errorTable(t)
	missing, extra := statusCodes{}, statusCodes{}
	for code, statuses := range want {
		for st := range statuses {
			if !table[code][st] {
				missing.add(code, st)
			}
		}
	}
	for code, statuses := range table {
		for st := range statuses {
			if !want[code][st] {
				extra.add(code, st)
			}
		}
	}
	if len(missing) > 0 {
		t.Errorf("docs/terminal-gateway.md's error table lacks %s", missing)
	}
	if len(extra) > 0 {
		t.Errorf("docs/terminal-gateway.md's error table lists %s, which the gateway does not answer", extra)
	}
	// agentd's refusals are passed on with the statuses the document
	// lists for them.
	for code, statuses := range passed {
		for st := range statuses {
			if st < 500 && !documented[code][st] {
				t.Errorf("agentd's %s is passed on as %d, which no gateway operation lists", code, st)
			}
		}
	}
}
