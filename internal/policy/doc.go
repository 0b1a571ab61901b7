// Package policy holds what an agent may run and reach without a person:
// execution rules over programs and their arguments, network rules over
// hosts, ports, methods and paths, their validation, and their
// evaluation. It is pure (no database, no network, no clock): the console
// checks every request against a policy before it runs, and agentd
// applies the same rules, from the copy each create carries, where
// programs start and connections leave.
//
// # Execution rules
//
// An Exec policy has a default (allow, ask or deny), a dynamic setting
// for what cannot be known before it runs (default ask), an approval
// timeout, and ordered rules. A rule names a program by Program, a glob
// over its base name ("git", "mkfs.*", "*") or, when it has a slash, over
// its absolute path ("/usr/sbin/*", where `*` stays within a directory);
// optionally by Args, space-separated words over the remaining arguments
// in which `*` is any number of words, `?` exactly one, and any other
// word a shell case pattern over one word (its `*` crosses slashes); and
// optionally by SHA256, the program file's content. For git, a deny or
// ask rule's Args also meet the arguments without git's global options
// before the subcommand (-C path, -c name=value, --git-dir, --work-tree,
// --namespace, --config-env, --exec-path, --no-pager/-P, --paginate/-p,
// --bare, --no-replace-objects, the pathspec options and the like, with
// their values, attached by = or not; and a `--`), so "push *" denies git
// -C . push, both in DecideCommand and DecideProgram; an option before
// the subcommand that the gateway does not know leaves the rule one that
// may apply (the dynamic setting decides). Allow rules match only the
// arguments as written, since an option like -c can change what the
// subcommand runs. A Text rule instead
// matches a regular expression against the raw command line and each
// env variable of the request (as NAME=value and as the value): legacy
// command patterns become such deny rules (FromPatterns). Text rules only
// deny or ask. Every matching rule counts and the strictest wins (deny >
// ask > allow), else the default. A shell builtin (cd, echo, export…)
// starts no program: only rules naming it apply, not the default.
//
// # Checking a command line (the gateway)
//
// DecideCommand parses the line with a real shell parser (bash's
// grammar, a superset of what sh, dash and busybox accept; a line it
// rejects is refused with its message, as a *ParseError) and decides
// every simple command in it: in lists, pipelines, subshells, blocks,
// if/while/until/for/select/case bodies, function bodies, command and
// process substitutions, coprocesses, and the words of [[ ]], (( )) and
// redirections. Quotes and escapes are resolved as the shell would, and
// bash's brace expansion is applied ({rm,x} is `rm x`). A program written
// with a slash is cleaned lexically (/usr/bin/../bin/rm is /usr/bin/rm);
// rules without a slash match its base name whether it was written
// absolute, relative (./rm, ../x/rm) or bare. Strings that are run as
// code are parsed and checked in turn, recursively:
//
//   - shells: sh, bash, rbash, dash, ash, zsh, ksh, ksh93, mksh, lksh,
//     oksh, pdksh, posh, yash with -c, or reading a here-document or
//     here-string (bash <<EOF, sh <<< '…', bash /dev/stdin);
//   - builtins and keywords: eval (its words joined), trap's action,
//     alias values, mapfile -C, compgen -C and compgen -W (its word
//     list, whose substitutions run), command, builtin, exec, hash -p
//     (the file it names), and time (with or without -p, and after its
//     `--`);
//   - wrappers, after their options and up to their command: env (its
//     NAME=value words and -S), sudo, doas, pkexec, nice, nohup, timeout,
//     stdbuf, setsid, chroot, ionice, chrt, taskset, unshare, nsenter,
//     strace, ltrace, /usr/bin/time, fakeroot, cgexec, gosu, su-exec,
//     chronic, unbuffer, proxychains, catchsegv; busybox and toybox
//     applets; xargs (with arguments from its input); find's -exec,
//     -execdir, -ok and -okdir ({} is the file name); watch (its words
//     run by sh -c, or as they are with -x); su, runuser and script -c;
//     runuser -u; flock (a command or -c); sg.
//
// A wrapper's option the gateway does not know leaves its command
// unknown. Each command found is listed in CommandDecision.Commands with
// its own decision and the wrappers it runs inside, for the "try a
// command" box and for audit details; Explain says what decided.
//
// # What is known only when it runs
//
// A program named by a variable or a substitution ($X, "$@", $(…),
// r${IFS}m), a file name pattern as the program (/bin/r?), eval or a
// shell given what is known only at run time, source or a shell script
// file, a shell reading its input from a pipe or a file, a name that an
// alias, a function or hash -p on the same line may redefine, an
// interactive shell a wrapper starts, a shell whose language is not
// parsed (fish, csh, pwsh…), BASH_ENV, ENV, LD_PRELOAD, LD_AUDIT or an
// exported function set for a command, a prompt set (PS0 to PS4,
// PROMPT_COMMAND: bash expands them, PS4 under set -x, running their
// command substitutions) by assignment, declare, a nameref, printf -v,
// read or mapfile, a ${name@P} prompt expansion, compgen -F (a shell
// function), fc other than fc -l (it runs history entries, which history
// -s can write), and a quoted string that hides a command substitution
// in an array subscript (bash runs it when it evaluates the string as
// arithmetic) are decided by the dynamic setting. So are arguments that a rule's args pattern may or may not
// match ("git $CMD" against "push *"). The dynamic setting is bounded by
// what the rules could decide: when every possible outcome is the same
// (no rule could deny what the default allows), that outcome stands; an
// unknown is never decided more strictly than its strictest possible
// outcome, nor more leniently than its least strict one. With a deny
// rule in the policy, such a command is therefore never allowed unless
// dynamic is allow. Where code is partly known (bash -c "rm $X"), the
// known part is checked as well.
//
// # What only agentd can check
//
// Which file a name found on PATH or a relative path is, and a file's
// content, are seen only where the program starts. At the gateway an
// allow rule naming a path or a content applies to a command written
// without an absolute path when its name fits, and deny and ask rules of
// that kind are left to agentd; ExecPaths are checked only for absolute
// paths. agentd decides each program start with DecideProgram, where a
// program outside ExecPaths is denied, deny and ask rules also match
// argv[0]'s base name, and a busybox applet is decided by its name.
// Path, content and exec-path rules need that enforcement: pair them
// with RequireEnforcement.
//
// The gateway sees only the line. Only enforcement at exec time catches
// what it cannot: the commands in scripts and files (python x.py, make,
// npm scripts, git hooks, Makefiles), programs started by other programs
// (python -c, perl -e, node -e, awk's system(), vim's
// :!, git -c alias, ssh running commands elsewhere, tmux, screen,
// parallel, systemd-run), values read at run time (files, network
// responses, variables from the environment of the sandbox), and what is
// typed into an interactive shell through stdin.
//
// # Network rules
//
// A Network policy has a default (allow or deny: a connection cannot wait
// for a person) and rules over a host (a name; `*.name` for its
// subdomains, not name itself; an IPv4 or IPv6 address; a CIDR; `*` for
// every host), ports (none: every port), HTTP methods and path globs
// (seen on plain HTTP, and on HTTPS when a rule inspects the host). When
// the method or path of a connection is not seen, a rule restricted to
// them applies if it denies or asks and not if it allows. The strictest
// matching rule wins, else the default. MayResolve tells agentd's
// resolver which names to answer: only those a rule could allow (or any
// name the default allows and no rule denies outright), so DNS carries
// nothing out; address and CIDR rules allow addresses, not names.
// DecideURL decides a URL for the "try a URL" box as the egress proxy
// would.
//
// # Storing policies
//
// ParseExec and ParseNetwork read a policy as JSON, refusing unknown
// fields; Normalize fills defaults and tidies what people type; Validate
// and ValidateInto report field errors keyed like "rules[2].program",
// with messages that name the rule ("Rule 3: …"). Canonical is the
// normalized JSON of a policy and Digest its SHA-256, equal for every
// way of writing one policy, so versions can be compared.
package policy
