package policy_test

import (
	"slices"
	"testing"
	"time"

	"github.com/gatehouse/gatehouse/internal/policy"
)

// benchPolicy has 20 rules of the kinds agents carry: names, arguments,
// paths, a content pin and migrated text patterns.
func benchPolicy() policy.Exec {
	p := policy.DefaultExec()
	p.Rules = []policy.ExecRule{
		{Action: policy.Deny, Program: "rm", Args: "* -*r* /*"},
		{Action: policy.Deny, Program: "shutdown"},
		{Action: policy.Deny, Program: "reboot"},
		{Action: policy.Deny, Program: "mkfs*"},
		{Action: policy.Deny, Program: "dd", Args: "* of=/dev/*"},
		{Action: policy.Ask, Program: "git", Args: "push *"},
		{Action: policy.Deny, Program: "git", Args: "push --force *"},
		{Action: policy.Ask, Program: "curl", Args: "* -X POST *"},
		{Action: policy.Ask, Program: "kubectl", Args: "delete *"},
		{Action: policy.Ask, Program: "terraform", Args: "apply *"},
		{Action: policy.Deny, Program: "/usr/sbin/*"},
		{Action: policy.Allow, Program: "go"},
		{Action: policy.Allow, Program: "npm", Args: "test *"},
		{Action: policy.Ask, Program: "npm", Args: "publish *"},
		{Action: policy.Ask, Program: "docker", Args: "push *"},
		{Action: policy.Deny, Program: "nc"},
		{Action: policy.Allow, Program: "python3", SHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		{Action: policy.Deny, Text: `curl[^|]*\|\s*(ba)?sh`, Reason: policy.MigratedReason},
		{Action: policy.Deny, Text: `(?i)drop\s+database`, Reason: policy.MigratedReason},
		{Action: policy.Deny, Text: `:\(\)\s*\{`, Reason: policy.MigratedReason},
	}
	return p
}

var benchLines = []struct{ name, line string }{
	{"simple", "git status"},
	{"pipeline", "ls -la /work && cat README.md | head -n 20"},
	{"go-test", "cd /work/repo && go test ./... 2>&1 | tail -n 50"},
	{"bash-c", "bash -c 'npm ci && npm test -- --runInBand'"},
	{"find-exec", "find . -name '*.go' -exec grep -l TODO {} +"},
	{"substitution", `python3 -m pytest -x -q "$(git rev-parse --show-toplevel)/tests" > /tmp/out.txt; echo "exit $?"`},
}

// BenchmarkDecideCommand measures what the rules add to one exec: a
// compiled 20-rule policy checking typical one-line commands.
func BenchmarkDecideCommand(b *testing.B) {
	p := benchPolicy()
	if err := p.Validate(); err != nil {
		b.Fatal(err)
	}
	c, err := p.Compile()
	if err != nil {
		b.Fatal(err)
	}
	env := map[string]string{"CI": "1", "GOFLAGS": "-mod=mod"}
	for _, bl := range benchLines {
		b.Run(bl.name, func(b *testing.B) {
			b.ReportAllocs()
			var took []time.Duration
			for b.Loop() {
				start := time.Now()
				if _, err := c.DecideCommand(bl.line, env); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
			}
			reportPercentiles(b, took)
		})
	}
	// Deciding against the policy itself compiles it each time.
	b.Run("uncompiled/go-test", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.DecideCommand(benchLines[2].line, env); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecideProgram measures agentd's exec-time decision, on the
// policy as stored and compiled once.
func BenchmarkDecideProgram(b *testing.B) {
	p := benchPolicy()
	c, err := p.Compile()
	if err != nil {
		b.Fatal(err)
	}
	prog := policy.Program{Path: "/usr/bin/git", Argv: []string{"git", "push", "origin", "main"}}
	for name, decide := range map[string]func(policy.Program) policy.Decision{"exec": p.DecideProgram, "checker": c.DecideProgram} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var took []time.Duration
			for b.Loop() {
				start := time.Now()
				decide(prog)
				took = append(took, time.Since(start))
			}
			reportPercentiles(b, took)
		})
	}
}

// reportPercentiles reports the median and the 99th percentile of the
// calls' durations: on a busy machine the mean (ns/op) counts the time a
// call waited for a CPU, the median mostly does not.
func reportPercentiles(b *testing.B, took []time.Duration) {
	if len(took) == 0 {
		return
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds()), "p99-ns")
}
