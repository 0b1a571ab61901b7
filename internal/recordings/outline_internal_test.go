package recordings

import (
	"slices"
	"testing"
)

// TestMarkScanner: OSC 133 marks are found however the output is split
// into chunks, the echo between B and C is the typed line (escapes removed,
// backspaces applied, a redraw's last line), D gives its exit code, and a
// prompt without C (an empty line, marks switched off) adds nothing.
func TestMarkScanner(t *testing.T) {
	const (
		a = "\x1b]133;A\x07"
		b = "\x1b]133;B\x07"
		c = "\x1b]133;C\x07"
	)
	out := a + "$ " + b + "cd /tmp\r\n\x1b[?2004l\r" + c + "\x1b]133;D;0\x07" +
		a + "$ " + b + "\r\n" + a + "$ " + b + "ls -x\b \blh\r\n" + c + "total 0\r\n\x1b]133;D;2\x1b\\" +
		a + "$ " + b + "echo \x1b[1mbold\x1b[0m\r\n" + c + "bold\r\n" + "\x1b]133;D;0\x07" +
		"$ " + b + "typed without marks\r\nout\r\n" + "$ " + b + "exit\r\n" + c
	want := []string{"cd /tmp", "ls -lh", "echo bold", "exit"}
	codes := []int{0, 2, 0, -1}
	for _, size := range []int{len(out), 1, 3, 7} {
		var o Outline
		var sc markScanner
		for i := 0; i < len(out); i += size {
			sc.scan([]byte(out[i:min(i+size, len(out))]), float64(i), &o)
		}
		var got []string
		var gotCodes []int
		for _, l := range o.Lines {
			got = append(got, l.Text)
			code := -1
			if l.ExitCode != nil {
				code = *l.ExitCode
			}
			gotCodes = append(gotCodes, code)
		}
		if !slices.Equal(got, want) || !slices.Equal(gotCodes, codes) {
			t.Errorf("chunks of %d: lines %q codes %v, want %q %v", size, got, gotCodes, want, codes)
		}
	}
}
