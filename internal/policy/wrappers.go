package policy

import (
	"strings"
)

// builtins run in the shell itself and start no program: the default
// does not apply to them, only rules naming them. Builtins that run
// commands (eval, source, exec, command, builtin, trap, alias) are
// unwrapped as well.
var builtins = setOf(":", ".", "[", "alias", "bg", "bind", "break", "builtin", "caller", "cd", "command",
	"compgen", "complete", "compopt", "continue", "declare", "dirs", "disown", "echo", "enable", "eval",
	"exec", "exit", "export", "false", "fc", "fg", "getopts", "hash", "help", "history", "jobs", "kill",
	"let", "local", "logout", "mapfile", "popd", "printf", "pushd", "pwd", "read", "readarray", "readonly",
	"return", "set", "shift", "shopt", "source", "suspend", "test", "times", "trap", "true", "type",
	"typeset", "ulimit", "umask", "unalias", "unset", "wait")

// shells are the shells whose language the gateway parses: their -c
// strings, here-documents and here-strings are checked like the line.
var shells = setOf("sh", "bash", "rbash", "dash", "ash", "zsh", "ksh", "ksh93", "mksh", "lksh", "oksh", "pdksh", "posh", "yash")

// foreignShells run commands in a language the gateway does not parse:
// whatever they run is decided by the dynamic setting.
var foreignShells = setOf("fish", "csh", "tcsh", "pwsh", "powershell", "nu", "elvish", "xonsh", "rc", "es")

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// opts describes a wrapper's options, so the gateway can tell where its
// command starts. An option the gateway does not know makes that unknown.
type opts struct {
	arg       string // short options taking an argument (-u user, -uuser)
	optional  string // short options taking an argument only when attached (-i{})
	flag      string // short options without one
	noRun     string // short options with which no command runs (command -v)
	longArg   []string
	longFlag  []string // long flags; an attached =value is allowed
	longNoRun []string
	digits    bool // -5 is an option (nice)
	dash      bool // "-" alone is an option (env)
}

// wrapper is a program that runs its arguments as a command.
type wrapper struct {
	opts
	assigns  bool // NAME=value words may follow the options (env, sudo)
	operands int  // words between the options and the command (timeout's duration)
	// interactive: with no command, it starts an interactive shell.
	interactive bool
	// shell: the command runs in the shell itself (command, builtin).
	shell bool
}

// wrappers are the programs and builtins unwrapped at the gateway, by
// name; find, xargs, su, runuser, script, flock, sg, watch, busybox and
// the shells have rules of their own in unwrap.
var wrappers = map[string]wrapper{
	"env": {opts: opts{arg: "uCSP", flag: "i0v", dash: true,
		longArg:   []string{"unset", "chdir", "split-string"},
		longFlag:  []string{"ignore-environment", "null", "debug", "default-signal", "ignore-signal", "block-signal", "list-signal-handling"},
		longNoRun: []string{"help", "version"}}, assigns: true},
	"command": {opts: opts{flag: "p", noRun: "vV"}, shell: true},
	"builtin": {shell: true},
	"exec":    {opts: opts{arg: "a", flag: "cl"}},
	"nice":    {opts: opts{arg: "n", digits: true, longArg: []string{"adjustment"}, longNoRun: []string{"help", "version"}}},
	"nohup":   {opts: opts{longNoRun: []string{"help", "version"}}},
	"timeout": {opts: opts{arg: "sk", flag: "fpv", longArg: []string{"signal", "kill-after"},
		longFlag: []string{"foreground", "preserve-status", "verbose"}, longNoRun: []string{"help", "version"}}, operands: 1},
	"sudo": {opts: opts{arg: "ugCDhprtTUR", flag: "AbBEHiknNPSs", noRun: "lvKVe",
		longArg:   []string{"user", "group", "close-from", "chdir", "host", "prompt", "role", "type", "command-timeout", "other-user", "chroot"},
		longFlag:  []string{"askpass", "background", "bell", "preserve-env", "preserve-groups", "set-home", "login", "reset-timestamp", "non-interactive", "shell", "stdin", "no-update"},
		longNoRun: []string{"list", "validate", "version", "help", "edit", "remove-timestamp"}}, assigns: true, interactive: true},
	"doas":   {opts: opts{arg: "uC", flag: "nsL", noRun: "C"}, interactive: true},
	"pkexec": {opts: opts{longArg: []string{"user"}, longFlag: []string{"disable-internal-agent", "keep-cwd"}, longNoRun: []string{"help", "version"}}, interactive: true},
	"stdbuf": {opts: opts{arg: "ioe", longArg: []string{"input", "output", "error"}, longNoRun: []string{"help", "version"}}},
	"time":   {opts: opts{arg: "fo", flag: "apqv", noRun: "V", longArg: []string{"format", "output"}, longFlag: []string{"append", "portability", "quiet", "verbose"}, longNoRun: []string{"help", "version"}}},
	"setsid": {opts: opts{flag: "cfw", longFlag: []string{"ctty", "fork", "wait"}, longNoRun: []string{"help", "version"}}},
	"chroot": {opts: opts{longArg: []string{"userspec", "groups"}, longFlag: []string{"skip-chdir"}, longNoRun: []string{"help", "version"}}, operands: 1, interactive: true},
	"ionice": {opts: opts{arg: "cnpPu", flag: "t", noRun: "pPu", longArg: []string{"class", "classdata", "pid", "pgid", "uid"}, longFlag: []string{"ignore"}, longNoRun: []string{"help", "version"}}},
	"chrt": {opts: opts{arg: "TPD", flag: "abdfiorRv", noRun: "pm", longArg: []string{"sched-runtime", "sched-period", "sched-deadline"},
		longFlag: []string{"all-tasks", "batch", "deadline", "fifo", "idle", "other", "rr", "reset-on-fork", "verbose"}, longNoRun: []string{"pid", "max", "help", "version"}}, operands: 1},
	"taskset": {opts: opts{flag: "ac", noRun: "p", longFlag: []string{"all-tasks", "cpu-list"}, longNoRun: []string{"pid", "help", "version"}}, operands: 1},
	"unshare": {opts: opts{arg: "SGRwl", flag: "muinpUCTfrc",
		longArg:  []string{"setuid", "setgid", "root", "wd", "propagation", "setgroups", "load-interp"},
		longFlag: []string{"mount", "uts", "ipc", "net", "pid", "user", "cgroup", "time", "fork", "kill-child", "mount-proc", "mount-binfmt", "map-root-user", "map-current-user", "map-auto", "map-user", "map-group", "map-users", "map-groups", "keep-caps", "monotonic", "boottime"}}, interactive: true},
	"nsenter": {opts: opts{arg: "tSG", optional: "muinpUCTrw", flag: "aFZ",
		longArg:  []string{"target", "setuid", "setgid"},
		longFlag: []string{"all", "mount", "uts", "ipc", "net", "pid", "user", "cgroup", "time", "root", "wd", "no-fork", "preserve-credentials", "follow-context", "user-parent", "join-cgroup", "env"}}, interactive: true},
	"strace":       {opts: opts{arg: "abeEIoOpPsSuUX", flag: "cCdDfFiknqrtTvwxyzZ", noRun: "hV"}},
	"ltrace":       {opts: opts{arg: "aADeFlnopsuwx", flag: "bcCfiLrStT", noRun: "hV"}},
	"fakeroot":     {opts: opts{arg: "lsib", flag: "u", longArg: []string{"lib", "faked"}, longFlag: []string{"unknown-is-real"}, longNoRun: []string{"help", "version"}}, interactive: true},
	"cgexec":       {opts: opts{arg: "g", longFlag: []string{"sticky"}}},
	"gosu":         {operands: 1},
	"su-exec":      {operands: 1},
	"chronic":      {opts: opts{flag: "ev"}},
	"unbuffer":     {opts: opts{flag: "p"}},
	"proxychains":  {opts: opts{arg: "f", flag: "q"}},
	"proxychains4": {opts: opts{arg: "f", flag: "q"}},
	"catchsegv":    {},
}

// parsedOpts is a wrapper's argument list split at its command.
type parsedOpts struct {
	set   map[string]word // options seen ("-u", "--user") and their arguments
	rest  []word          // the first operand on
	noRun bool
	// unknown says why the command cannot be told apart from options.
	unknown string
}

// parseOpts reads name's options from args up to the first operand (the
// wrappers stop there, as POSIX getopt does: `timeout 5 rm -f x`). A long
// option may be shortened to any unambiguous prefix, as getopt_long lets.
func parseOpts(name string, o opts, args []word) parsedOpts {
	r := parsedOpts{set: map[string]word{}}
	i := 0
	for ; i < len(args); i++ {
		a := args[i]
		if !a.known() {
			break // an option or the command: either way known only when it runs
		}
		t := a.text
		switch {
		case t == "--":
			r.rest = args[i+1:]
			return r
		case t == "-" && o.dash:
			r.set["-"] = word{}
		case o.digits && len(t) > 1 && t[0] == '-' && isDigits(strings.TrimPrefix(t[1:], "-")):
			r.set["-n"] = word{text: t[1:], src: t}
		case strings.HasPrefix(t, "--"):
			n, val, has := strings.Cut(t[2:], "=")
			v := word{text: val, src: t}
			kind, full := longKind(o, n)
			switch kind {
			case 'a':
				if !has && i+1 < len(args) {
					i++
					v = args[i]
				}
			case 'f':
			case 'n':
				r.noRun = true
			default:
				r.unknown = "`" + t + "` is an option of " + name + " the gateway does not know, so it cannot tell what " + name + " runs"
				return r
			}
			r.set["--"+full] = v
		case len(t) > 1 && t[0] == '-':
			for k := 1; k < len(t); k++ {
				ch := t[k]
				key := "-" + string(ch)
				switch {
				case strings.IndexByte(o.arg, ch) >= 0:
					v := word{text: t[k+1:], src: t}
					if v.text == "" && i+1 < len(args) {
						i++
						v = args[i]
					}
					r.set[key] = v
					k = len(t)
				case strings.IndexByte(o.optional, ch) >= 0:
					r.set[key] = word{text: t[k+1:], src: t}
					k = len(t)
				case strings.IndexByte(o.flag, ch) >= 0:
					r.set[key] = word{}
				default:
					if strings.IndexByte(o.noRun, ch) < 0 {
						r.unknown = "`-" + string(ch) + "` is an option of " + name + " the gateway does not know, so it cannot tell what " + name + " runs"
						return r
					}
				}
				if strings.IndexByte(o.noRun, ch) >= 0 {
					r.noRun = true
				}
			}
		default:
			r.rest = args[i:]
			return r
		}
	}
	r.rest = args[i:]
	return r
}

// longKind classifies a long option, accepting an unambiguous prefix:
// 'a' takes an argument, 'f' is a flag, 'n' runs nothing, 0 unknown.
func longKind(o opts, n string) (byte, string) {
	var kind byte
	var full string
	found := 0
	for _, g := range []struct {
		k     byte
		names []string
	}{{'a', o.longArg}, {'f', o.longFlag}, {'n', o.longNoRun}} {
		for _, name := range g.names {
			if name == n {
				return g.k, name
			}
			if strings.HasPrefix(name, n) && n != "" {
				kind, full = g.k, name
				found++
			}
		}
	}
	if found == 1 {
		return kind, full
	}
	return 0, ""
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isAssignment(t string) bool {
	name, _, ok := strings.Cut(t, "=")
	if !ok || name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9' || strings.HasPrefix(name, "BASH_FUNC_")) {
			return false
		}
	}
	return true
}

func isStdinPath(a word) bool {
	return a.known() && (a.text == "/dev/stdin" || a.text == "/dev/fd/0" || a.text == "/proc/self/fd/0")
}

// shellBuiltin walks what a shell builtin runs, reporting whether name
// is one; exec, command and builtin are not: they run a program as
// unwrap's wrappers do.
func (w *walker) shellBuiltin(name string, args []word, in stdin, sc *scope, text string) bool {
	switch name {
	case "eval":
		if len(args) == 0 {
			return true
		}
		w.code(joinWords(args), sc, "eval")
		return true
	case "source", ".":
		if len(args) == 0 {
			return true
		}
		if isStdinPath(args[0]) {
			w.stdinCode(in, sc, name)
		} else {
			w.dynamic(sc, text, name+" runs the commands in the file "+args[0].src+", known only when it runs")
		}
		return true
	case "trap":
		w.trap(args, sc, text)
		return true
	case "alias":
		for _, a := range args {
			if !a.known() {
				w.dynamic(sc, text, "alias defines `"+a.src+"`, known only when it runs")
				continue
			}
			if n, v, ok := strings.Cut(a.text, "="); ok {
				w.redefined[n] = "an alias defined on this line"
				w.code(word{text: v, src: a.src}, sc, "alias "+n)
			}
		}
		return true
	case "hash":
		p := parseOpts(name, opts{arg: "pt", flag: "dlr"}, args)
		if v, ok := p.set["-p"]; ok {
			for _, n := range p.rest {
				w.redefined[n.text] = "hashed to " + v.src + " on this line"
			}
			w.run([]word{v}, in, sc.inside("hash -p"), false, "hash -p "+v.src, "")
		}
		return true
	case "mapfile", "readarray":
		p := parseOpts(name, opts{arg: "dnOsuCc", flag: "t"}, args)
		if cb, ok := p.set["-C"]; ok {
			w.code(cb, sc, name+" -C")
		}
		if p.unknown != "" {
			w.dynamic(sc, text, p.unknown)
		}
		return true
	case "compgen":
		// -C runs a command and -W's word list is expanded (its
		// substitutions run): both are code; -F calls a shell function,
		// which may be anything by the time it runs.
		p := parseOpts(name, opts{arg: "oAGWFCXPSV", flag: "abcdefgjksuvI"}, args)
		if cb, ok := p.set["-C"]; ok {
			w.code(cb, sc, name+" -C")
		}
		if wl, ok := p.set["-W"]; ok {
			wl.text = ": " + wl.text
			w.code(wl, sc, name+" -W")
		}
		if fn, ok := p.set["-F"]; ok {
			w.dynamic(sc, text, name+" -F calls the shell function "+fn.src+", whose commands are known only when it runs")
		}
		if p.unknown != "" {
			w.dynamic(sc, text, p.unknown)
		}
		return true
	case "enable":
		p := parseOpts(name, opts{arg: "fd", flag: "anps"}, args)
		if _, ok := p.set["-f"]; ok || p.unknown != "" {
			w.dynamic(sc, text, "enable -f loads a builtin from a file, whose code is known only when it runs")
		}
		return true
	case "exec", "command", "builtin":
		return false
	}
	return builtins[name]
}

// unwrap walks what the command name, given args, runs in turn.
func (w *walker) unwrap(name string, args []word, in stdin, sc *scope, shell bool, text string) {
	if shell && w.shellBuiltin(name, args, in, sc, text) {
		return
	}
	switch {
	case shells[name]:
		w.shell(name, args, in, sc)
		return
	case foreignShells[name]:
		if len(args) == 1 && (args[0].text == "--version" || args[0].text == "--help") {
			return
		}
		w.dynamic(sc, text, name+" runs commands in a language the gateway does not parse")
		return
	case name == "busybox" || name == "toybox":
		if len(args) == 0 || args[0].known() && strings.HasPrefix(args[0].text, "-") {
			return
		}
		w.run(args, in, sc.inside(name), false, srcOf(args), "")
		return
	case name == "xargs":
		w.xargs(args, sc)
		return
	case name == "find":
		w.find(args, in, sc, text)
		return
	case name == "watch":
		w.watch(args, sc, text)
		return
	case name == "su" || name == "runuser" || name == "script":
		w.su(name, args, in, sc, text)
		return
	case name == "flock":
		w.flock(args, in, sc, text)
		return
	case name == "sg":
		if len(args) < 2 {
			w.interactive(sc, text, name)
			return
		}
		rest := args[1:]
		if rest[0].known() && rest[0].text == "-c" {
			rest = rest[1:]
		}
		w.shellString(rest, sc, text, "sg")
		return
	}
	spec, ok := wrappers[name]
	if !ok {
		return
	}
	p := parseOpts(name, spec.opts, args)
	if name == "env" {
		p = w.envSplit(p)
	}
	if p.unknown != "" {
		w.dynamic(sc, text, p.unknown)
		return
	}
	if p.noRun {
		return
	}
	rest := p.rest
	extra := ""
	if spec.assigns {
		for len(rest) > 0 && rest[0].known() && isAssignment(rest[0].text) {
			n, _, _ := strings.Cut(rest[0].text, "=")
			if why := runsCode(n); why != "" {
				extra = "`" + rest[0].src + "` " + why
			}
			rest = rest[1:]
		}
	}
	if len(rest) < spec.operands {
		return
	}
	rest = rest[spec.operands:]
	if len(rest) == 0 {
		_, s := p.set["-s"]
		_, i := p.set["-i"]
		if spec.interactive && (name != "sudo" && name != "doas" || s || i) {
			w.interactive(sc, text, name)
		}
		return
	}
	// command and builtin run in the shell; as programs (some systems
	// ship /usr/bin/command) they run what follows all the same.
	w.run(rest, in, sc.inside(name), spec.shell && shell, srcOf(rest), extra)
}

// envSplit applies env -S (--split-string): its string is split into
// words that stand where it stood, options included.
func (w *walker) envSplit(p parsedOpts) parsedOpts {
	for range 3 {
		v, ok := p.set["-S"]
		if !ok {
			v, ok = p.set["--split-string"]
		}
		if !ok || p.unknown != "" {
			return p
		}
		s := v.text
		if !v.known() || strings.ContainsAny(s, "\"'\\$") {
			p.unknown = "env -S splits `" + s + "` in ways the gateway does not follow"
			return p
		}
		var words []word
		for _, f := range strings.Fields(s) {
			words = append(words, word{text: f, src: f})
		}
		q := parseOpts("env", wrappers["env"].opts, append(words, p.rest...))
		for k, v := range p.set {
			if _, ok := q.set[k]; !ok && k != "-S" && k != "--split-string" {
				q.set[k] = v
			}
		}
		q.noRun = q.noRun || p.noRun
		p = q
	}
	return p
}

// interactive records a wrapper that starts an interactive shell: what it
// runs is typed later.
func (w *walker) interactive(sc *scope, text, name string) {
	w.dynamic(sc, text, name+" starts an interactive shell, whose commands are typed only when it runs")
}

// stdinCode walks what a shell reads on its standard input.
func (w *walker) stdinCode(in stdin, sc *scope, name string) {
	if in.ok {
		w.code(in.code, sc, name+" <<…")
		return
	}
	w.dynamic(sc, name, name+" reads commands from "+in.from+", known only when it runs")
}

// shellString walks words joined into one shell command string.
func (w *walker) shellString(ws []word, sc *scope, text, label string) {
	if len(ws) == 0 {
		return
	}
	w.code(joinWords(ws), sc, label)
}

// shell walks what a shell runs: its -c string, its standard input (a
// here-document or here-string), or a script file (unknown).
func (w *walker) shell(name string, args []word, in stdin, sc *scope) {
	cflag, sflag := false, false
	i := 0
loop:
	for ; i < len(args); i++ {
		a := args[i]
		if !a.known() {
			break
		}
		t := a.text
		switch {
		case t == "--" || t == "-":
			i++
			break loop
		case strings.HasPrefix(t, "--"):
			n, _, has := strings.Cut(t[2:], "=")
			switch {
			case n == "rcfile" || n == "init-file" || name == "zsh" && n == "emulate":
				if !has {
					i++
				}
			case n == "help" || n == "version":
				return
			case bashLong[n] || name == "zsh":
			default:
				w.dynamic(sc, name+" "+srcOf(args), "`"+t+"` is an option of "+name+" the gateway does not know, so it cannot tell what "+name+" runs")
				return
			}
		case len(t) > 1 && (t[0] == '-' || t[0] == '+'):
			for k := 1; k < len(t); k++ {
				switch ch := t[k]; {
				case ch == 'c':
					cflag = true
				case ch == 's':
					sflag = true
				case ch == 'o' || ch == 'O' || (ch == 'R' || ch == 'T') && strings.Contains(name, "ksh"):
					if k+1 == len(t) {
						i++
					}
					k = len(t)
				case ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' && name == "zsh":
				default:
					w.dynamic(sc, name+" "+srcOf(args), "`"+t+"` holds an option of "+name+" the gateway does not know, so it cannot tell what "+name+" runs")
					return
				}
			}
		default:
			break loop
		}
	}
	var rest []word
	if i < len(args) {
		rest = args[i:]
	}
	switch {
	case cflag:
		if len(rest) == 0 {
			return // -c without its string: the shell refuses to start
		}
		w.code(rest[0], sc, name+" -c")
	case !sflag && len(rest) > 0 && !isStdinPath(rest[0]):
		w.dynamic(sc, name+" "+rest[0].src, name+" runs the script "+rest[0].src+", whose commands are known only when it runs")
	default:
		w.stdinCode(in, sc, name)
	}
}

var bashLong = setOf("login", "noprofile", "norc", "posix", "restricted", "verbose", "debugger",
	"dump-strings", "dump-po-strings", "noediting", "pretty-print", "rpm-requires", "wordexp")

// trap walks the command a trap runs when its signal comes.
func (w *walker) trap(args []word, sc *scope, text string) {
	if len(args) > 0 && args[0].known() && args[0].text == "--" {
		args = args[1:]
	}
	if len(args) < 2 {
		return // trap -p, trap -l, or resetting one signal
	}
	if a := args[0]; a.text != "" && a.text != "-" {
		w.code(a, sc, "trap")
	}
}

// xargs walks the command xargs runs with arguments read from its input.
func (w *walker) xargs(args []word, sc *scope) {
	p := parseOpts("xargs", opts{arg: "adEILnPs", optional: "eil", flag: "0oprtx",
		longArg:   []string{"arg-file", "delimiter", "max-args", "max-procs", "max-chars", "process-slot-var"},
		longFlag:  []string{"null", "no-run-if-empty", "open-tty", "interactive", "verbose", "exit", "show-limits", "eof", "replace", "max-lines"},
		longNoRun: []string{"help", "version"}}, args)
	if p.unknown != "" {
		w.dynamic(sc, "xargs "+srcOf(args), p.unknown)
		return
	}
	if p.noRun {
		return
	}
	rest := p.rest
	if len(rest) == 0 {
		rest = []word{{text: "echo", src: "echo"}}
	}
	tok, replace := p.set["-I"]
	if v, ok := p.set["-i"]; ok {
		tok, replace = v, true
	}
	if v, ok := p.set["--replace"]; ok {
		tok, replace = v, true
	}
	token := tok.text
	if replace && token == "" {
		token = "{}"
	}
	input := word{text: unknownPart, src: "(input)", unknown: true, split: true}
	cmd := make([]word, 0, len(rest)+1)
	for _, a := range rest {
		if replace && strings.Contains(a.text, token) {
			a.text = strings.ReplaceAll(a.text, token, unknownPart)
			a.unknown = true
		}
		cmd = append(cmd, a)
	}
	if !replace {
		cmd = append(cmd, input)
	}
	w.run(cmd, stdin{from: "xargs's input"}, sc.inside("xargs"), false, srcOf(rest), "")
}

// find walks the commands of find's -exec, -execdir, -ok and -okdir.
func (w *walker) find(args []word, in stdin, sc *scope, text string) {
	// Outside the clauses, a word known only when it runs may be -exec
	// itself: a splitting one always, a single one when a terminator
	// follows it.
	var stray, maybeExec bool
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !a.known() {
			switch {
			case a.glob && !a.unknown:
				for _, s := range []string{"-exec", "-execdir", "-ok", "-okdir", ";", "+"} {
					stray = stray || matchGlob(a.text, s)
				}
			case a.split || a.glob:
				stray = true
			default:
				maybeExec = true
			}
			continue
		}
		switch a.text {
		case "-exec", "-execdir", "-ok", "-okdir":
			label := "find " + a.text
			var cmd []word
			j := i + 1
			for ; j < len(args); j++ {
				t := args[j]
				if t.known() && (t.text == ";" || t.text == "+" && j > i+1 && args[j-1].text == "{}") {
					break
				}
				cmd = append(cmd, t)
			}
			if j == len(args) {
				return // no terminator: find refuses to start
			}
			many := args[j].text == "+"
			for k, t := range cmd {
				if t.known() && strings.Contains(t.text, "{}") {
					cmd[k] = word{text: strings.ReplaceAll(t.text, "{}", unknownPart), src: t.src, unknown: true, split: many}
				}
			}
			w.run(cmd, in, sc.inside(label), false, srcOf(cmd), "")
			i = j
		case ";", "+":
			stray = stray || maybeExec
		}
	}
	if stray {
		w.dynamic(sc, text, "find is given words known only when it runs, which may start an -exec")
	}
}

// watch walks the command watch runs repeatedly: its words joined and run
// by sh -c, or, with -x, run as they are.
func (w *walker) watch(args []word, sc *scope, text string) {
	p := parseOpts("watch", opts{arg: "nq", optional: "d", flag: "bcCegptwrx",
		longArg:   []string{"interval", "equexit"},
		longFlag:  []string{"beep", "color", "no-color", "differences", "errexit", "chgexit", "exec", "precise", "no-title", "no-wrap", "no-linewrap", "no-rerun"},
		longNoRun: []string{"help", "version"}}, args)
	if p.unknown != "" {
		w.dynamic(sc, text, p.unknown)
		return
	}
	if p.noRun || len(p.rest) == 0 {
		return
	}
	_, x := p.set["-x"]
	_, exec := p.set["--exec"]
	if x || exec {
		w.run(p.rest, stdin{}, sc.inside("watch"), false, srcOf(p.rest), "")
		return
	}
	w.shellString(p.rest, sc, text, "watch")
}

// su walks what su, runuser and script run: a -c string through a shell,
// runuser -u's command as it is, or an interactive shell.
func (w *walker) su(name string, args []word, in stdin, sc *scope, text string) {
	// These permute their options: -c may follow the user name.
	var cmd *word
	user := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !a.known() {
			w.dynamic(sc, text, name+" is given `"+a.src+"`, known only when it runs")
			return
		}
		t := a.text
		switch {
		case t == "--" && name == "runuser" && user:
			w.run(args[i+1:], in, sc.inside(name), false, srcOf(args[i+1:]), "")
			return
		case t == "-c" || t == "--command" || t == "--session-command":
			if i+1 < len(args) {
				i++
				cmd = &args[i]
			}
		case strings.HasPrefix(t, "--command=") || strings.HasPrefix(t, "--session-command="):
			_, v, _ := strings.Cut(t, "=")
			cmd = &word{text: v, src: t}
		case t == "-u" && name == "runuser":
			user = true
			i++
		case name == "script" && (t == "-E" || t == "-o" || t == "-m" || t == "-T" || t == "-B" || t == "-I" || t == "-O" || t == "--echo" || t == "--output-limit" || t == "--logging-format" || t == "--log-timing" || t == "--log-io" || t == "--log-in" || t == "--log-out"):
			i++
		case name != "script" && (t == "-s" || t == "--shell" || t == "-g" || t == "--group" || t == "-G" || t == "--supp-group" || t == "-w" || t == "--whitelist-environment"):
			i++
		case user && !strings.HasPrefix(t, "-"):
			w.run(args[i:], in, sc.inside(name), false, srcOf(args[i:]), "")
			return
		}
	}
	if cmd == nil {
		w.interactive(sc, text, name)
		return
	}
	w.code(*cmd, sc, name+" -c")
}

// flock walks the command flock runs holding a lock: `flock file cmd…` or
// `flock file -c string`.
func (w *walker) flock(args []word, in stdin, sc *scope, text string) {
	p := parseOpts("flock", opts{arg: "wEc", flag: "sxeunoFv", longArg: []string{"timeout", "wait", "conflict-exit-code", "command"},
		longFlag: []string{"shared", "exclusive", "unlock", "nonblock", "nb", "close", "no-fork", "verbose"}, longNoRun: []string{"help", "version"}}, args)
	if p.unknown != "" {
		w.dynamic(sc, text, p.unknown)
		return
	}
	if p.noRun || len(p.rest) < 2 {
		if c, ok := p.set["-c"]; ok {
			w.code(c, sc, "flock -c")
		}
		return
	}
	rest := p.rest[1:]
	if rest[0].known() && (rest[0].text == "-c" || rest[0].text == "--command") {
		if len(rest) > 1 {
			w.code(rest[1], sc, "flock -c")
		}
		return
	}
	w.run(rest, in, sc.inside("flock"), false, srcOf(rest), "")
}
