package policy

import "strings"

// gitOptsWithArg are git's global options that take the next word as
// their value when it is not attached with `=` (-C and -c only as the
// next word).
var gitOptsWithArg = setOf("-C", "-c", "--git-dir", "--work-tree", "--namespace", "--super-prefix",
	"--config-env", "--shallow-file", "--attr-source", "--list-cmds")

// gitFlags are git's global options without a value (--exec-path alone
// prints a path; with =path it sets one).
var gitFlags = setOf("-p", "--paginate", "-P", "--no-pager", "--bare", "--no-replace-objects",
	"--literal-pathspecs", "--no-literal-pathspecs", "--glob-pathspecs", "--noglob-pathspecs",
	"--icase-pathspecs", "--no-optional-locks", "--no-advice", "--no-lazy-fetch", "--exec-path",
	"--html-path", "--man-path", "--info-path")

// gitSubcommand strips git's global options (git -C . -c k=v --no-pager
// push …) from args, so a rule's args pattern meets the subcommand as
// its first word. stripped reports that some option was removed; unknown
// says why the subcommand cannot be told (an option git may have that
// the gateway does not know), in which case rest is nil. A word known
// only when it runs ends the options: it and what follows are the rest.
func gitSubcommand(args []arg) (rest []arg, stripped bool, unknown string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a.unknown {
			return args[i:], stripped, ""
		}
		t := a.text
		name, _, attached := strings.Cut(t, "=")
		switch {
		case t == "--":
			return args[i+1:], true, ""
		case !strings.HasPrefix(t, "-") || t == "-h" || t == "--help" || t == "-v" || t == "--version":
			// The subcommand (git runs help or version for these).
			return args[i:], stripped, ""
		case gitOptsWithArg[t] && !attached:
			i++ // its value
		case gitOptsWithArg[name] && attached && strings.HasPrefix(t, "--"):
		case gitFlags[t] || name == "--exec-path" && attached:
		default:
			return nil, stripped, "`" + a.src + "` is an option of git the gateway does not know, so which subcommand runs is known only when it runs"
		}
		stripped = true
	}
	return nil, stripped, ""
}

// isGit reports whether t is git, by its name or argv[0].
func (t target) isGit() bool { return t.name == "git" || t.argv0 == "git" }
