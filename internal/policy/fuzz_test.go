package policy_test

import (
	"strings"
	"testing"

	"mvdan.cc/sh/v3/syntax"

	"github.com/gatehouse/gatehouse/internal/policy"
)

// FuzzDecideCommand checks that no line makes the walk panic, and that a
// line in which the parser finds a simple command named rm (plainly or
// quoted, anywhere: lists, pipelines, bodies, substitutions) is never
// allowed while rm is denied. Each input is also tried with `rm x`
// before and after it, so every input carries the denied program in
// simple forms.
func FuzzDecideCommand(f *testing.F) {
	for _, name := range []string{"denied_corpus.txt", "allowed_corpus.txt"} {
		for _, cl := range readCorpus(f, name, name == "denied_corpus.txt") {
			f.Add(cl.line, "")
		}
	}
	f.Add("a=$(b) c <<<d", "rm x")
	p := corpusPolicy(policy.Ask)
	c, err := p.Compile()
	if err != nil {
		f.Fatal(err)
	}
	parser := syntax.NewParser(syntax.Variant(syntax.LangBash))
	f.Fuzz(func(t *testing.T, line, value string) {
		for _, l := range []string{line, "rm x; " + line, line + "\nrm x", "(" + line + ") && rm x"} {
			d, err := c.DecideCommand(l, map[string]string{"V": value})
			if err != nil {
				continue // refused: the parser rejects it
			}
			if d.Action == policy.Allow && runsRm(parser, l) {
				t.Fatalf("%q is allowed, but runs rm: %s", l, d.Explain())
			}
		}
	})
}

// runsRm reports whether the parser finds a simple command named rm in
// line: an oracle independent of the walk under test.
func runsRm(parser *syntax.Parser, line string) bool {
	f, err := parser.Parse(strings.NewReader(line), "")
	if err != nil {
		return false
	}
	found := false
	syntax.Walk(f, func(n syntax.Node) bool {
		if c, ok := n.(*syntax.CallExpr); ok && len(c.Args) > 0 && plainName(c.Args[0]) == "rm" {
			found = true
		}
		return !found
	})
	return found
}

// plainName is a word without expansions, its quotes removed.
func plainName(w *syntax.Word) string {
	var b strings.Builder
	for _, p := range w.Parts {
		switch p := p.(type) {
		case *syntax.Lit:
			for i := 0; i < len(p.Value); i++ {
				if p.Value[i] == '\\' && i+1 < len(p.Value) {
					i++ // a backslash keeps the next character
				}
				b.WriteByte(p.Value[i])
			}
		case *syntax.SglQuoted:
			if p.Dollar {
				return ""
			}
			b.WriteString(p.Value)
		case *syntax.DblQuoted:
			for _, q := range p.Parts {
				l, ok := q.(*syntax.Lit)
				if !ok {
					return ""
				}
				b.WriteString(l.Value)
			}
		default:
			return ""
		}
	}
	return b.String()
}
