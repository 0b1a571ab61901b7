package views_test

import (
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/views"
)

// TestMarkdown checks the docs renderer: what it must produce, and that
// nothing it renders can run script or point at another origin.
func TestMarkdown(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, src string
		want      []string
		not       []string
	}{
		{"heading with anchor", "## Who may do what", []string{`<h2 id="who-may-do-what">Who may do what</h2>`}, nil},
		{"escaped html", "a <script>alert(1)</script> b", []string{"&lt;script&gt;"}, []string{"<script>"}},
		{"inline code keeps stars", "use `a*b*c` **now**", []string{"<code>a*b*c</code>", "<strong>now</strong>"}, nil},
		{"sibling doc link", "see [sessions](sessions.md#persistent-workspaces)", []string{`<a href="/docs/sessions#persistent-workspaces">sessions</a>`}, nil},
		{"foreign link dropped", "[e2b](https://e2b.dev) and [x](//evil.example/x)", []string{`<a href="#">e2b</a>`}, []string{"e2b.dev", "evil.example"}},
		{"table", "| a | b |\n|---|---|\n| `x` | y |", []string{"<table>", "<thead><tr><th>a</th>", "<tbody>", "<td><code>x</code></td>"}, []string{"---"}},
		{"list with continuation", "- one\n  more\n- two", []string{"<li>one more</li>", "<li>two</li>"}, nil},
		{"fenced code", "```\n<b>x</b>\n```", []string{"<pre><code>&lt;b&gt;x&lt;/b&gt;\n</code></pre>"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := views.Markdown(tc.src)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("Markdown(%q) = %q, want it to contain %q", tc.src, got, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(got, n) {
					t.Errorf("Markdown(%q) = %q, must not contain %q", tc.src, got, n)
				}
			}
		})
	}
}
