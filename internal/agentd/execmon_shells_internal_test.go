package agentd

import "testing"

// TestInteractiveShellEvasions: shells started with options that take an
// argument, or through a multi-call binary, are interactive shells all
// the same: typing bash -o vi (or busybox sh) at a prompt must not take
// what is typed next out of the audit log. Scripts and -c stay out.
func TestInteractiveShellEvasions(t *testing.T) {
	tests := []struct {
		argv []string
		want bool
	}{
		{[]string{"bash", "-o", "emacs"}, true},
		{[]string{"bash", "+o", "history"}, true},
		{[]string{"bash", "-O", "extglob", "-l"}, true},
		{[]string{"bash", "--rcfile", "/tmp/rc"}, true},
		{[]string{"bash", "--init-file", "/tmp/rc", "-i"}, true},
		{[]string{"bash", "+x"}, true},
		{[]string{"bash", "-lo", "vi"}, true},
		{[]string{"bash", "-s", "a", "b"}, true},
		{[]string{"/bin/busybox", "sh"}, true},
		{[]string{"busybox", "ash", "-l"}, true},
		{[]string{"tcsh"}, true},
		{[]string{"rbash"}, true},
		{[]string{"bash", "-o", "emacs", "-c", "ls"}, false},
		{[]string{"bash", "-o", "vi", "script.sh"}, false},
		{[]string{"bash", "--", "script.sh"}, false},
		{[]string{"bash", "--rcfile", "/tmp/rc", "script.sh"}, false},
		{[]string{"busybox", "sh", "-c", "ls"}, false},
		{[]string{"busybox", "ls"}, false},
		{[]string{"busybox"}, false},
		{[]string{"fish", "--command", "ls"}, false},
	}
	for _, tt := range tests {
		if got := interactiveShell(tt.argv); got != tt.want {
			t.Errorf("interactiveShell(%q) = %v, want %v", tt.argv, got, tt.want)
		}
	}
}
