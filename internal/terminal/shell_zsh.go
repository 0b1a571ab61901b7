package terminal

// zsh has no --rcfile: it reads its startup files from $ZDOTDIR (or
// $HOME). The terminal's zsh therefore starts with ZDOTDIR at a private
// directory (mode 0700, in $TMPDIR or /tmp, created by zsh's own mkdir so
// no program runs) whose .zshenv, .zprofile and .zshrc each source the
// user's own file of that name first, from the user's ZDOTDIR or HOME as
// zsh itself would (following a ZDOTDIR the user's .zshenv sets), and
// then point ZDOTDIR back at the private directory for the next file.
// The .zshrc removes the directory before it sources the user's .zshrc
// (zsh keeps the open file; a .zshrc that execs tmux leaks nothing),
// leaves ZDOTDIR as the user's own, so zsh reads the user's .zlogin
// itself, and then adds the OSC 133 hooks with add-zsh-hook, after
// everything of the user's that sets a prompt. Where a user file turns
// RCS off, zsh reads no further file: the directory goes and ZDOTDIR is
// the user's at once, without marks.
//
// The hooks are zsh's precmd (D;status of the line that ran, then A, and
// B appended to PS1 again when a prompt theme replaced it) and preexec
// (C), functions of builtins only: no process, nothing for exec records
// or the audit log. Like bash's, they are a convenience for replay, never
// the audit record.
//
// None of these holds a single quote: ShellCommand passes them in single
// quotes (as environment values the boot writes to the files).

// zshUserA, B and C make the part of each private startup file that
// sources the user's own file of that name (zshUserA + name + zshUserB +
// name + zshUserC) with ZDOTDIR as the user has it, then records ZDOTDIR
// as the user left it (a .zshenv may set it for the files after).
const (
	zshUserA = `if [[ -n ${__gatehouse_zdotdir+set} ]]; then export ZDOTDIR=$__gatehouse_zdotdir; else unset ZDOTDIR; fi
if [[ -r ${ZDOTDIR-$HOME}/`
	zshUserB = ` ]]; then builtin source ${ZDOTDIR-$HOME}/`
	zshUserC = `; fi
unset __gatehouse_zdotdir
if [[ -n ${ZDOTDIR+set} ]]; then __gatehouse_zdotdir=$ZDOTDIR; fi
`
)

// zshDone removes the private directory: everything zsh still needs of
// it is open already.
const zshDone = `zmodload -F zsh/files b:zf_rm b:zf_rmdir 2>/dev/null
zf_rm $__gatehouse_dir/.zshenv $__gatehouse_dir/.zprofile $__gatehouse_dir/.zshrc 2>/dev/null
zf_rmdir $__gatehouse_dir 2>/dev/null
unset __gatehouse_dir
`

// zshNext points ZDOTDIR back at the private directory for zsh's next
// startup file, unless the user's file turned RCS off (zsh reads no
// more): then the user's ZDOTDIR stays and the directory goes.
const zshNext = `if [[ -o rcs ]]; then ZDOTDIR=$__gatehouse_dir
else
` + zshDone + `unset __gatehouse_zdotdir
fi
`

// zshEnv is the private .zshenv: it takes over from the boot, which
// passed the user's ZDOTDIR (if set) in GATEHOUSE_ZDOTDIR.
const zshEnv = `__gatehouse_dir=$ZDOTDIR
unset __gatehouse_zdotdir
if [[ -n ${GATEHOUSE_ZDOTDIR+set} ]]; then __gatehouse_zdotdir=$GATEHOUSE_ZDOTDIR; fi
unset GATEHOUSE_ZDOTDIR
` + zshUserA + ".zshenv" + zshUserB + ".zshenv" + zshUserC + zshNext

const zshProfile = zshUserA + ".zprofile" + zshUserB + ".zprofile" + zshUserC + zshNext

const zshRC = zshDone + zshUserA + ".zshrc" + zshUserB + ".zshrc" + zshUserC + `unset __gatehouse_zdotdir
__gatehouse_ran=
builtin printf -v __gatehouse_b "%%{\033]133;B\007%%}"
__gatehouse_precmd() {
	local s=$?
	if [[ -n $__gatehouse_ran ]]; then builtin printf "\033]133;D;%s\007" $s; fi
	__gatehouse_ran=
	builtin printf "\033]133;A\007"
	if [[ $PS1 != *"$__gatehouse_b"* ]]; then PS1=$PS1$__gatehouse_b; fi
	return $s
}
__gatehouse_preexec() {
	__gatehouse_ran=1
	builtin printf "\033]133;C\007"
}
autoload -Uz add-zsh-hook
add-zsh-hook precmd __gatehouse_precmd
add-zsh-hook preexec __gatehouse_preexec
`

// zshBoot runs in "zsh -f" (no startup files: the real shell reads them)
// in agentd's session leader: it makes the private directory, writes the
// startup files from GATEHOUSE_ZSHENV, _ZPROFILE and _ZSHRC, and execs
// the login shell in its place (same pid, so what is typed into it stays
// the leader's direct children). If the directory cannot be made, the
// user gets zsh -l without marks.
const zshBoot = `zmodload -F zsh/files b:zf_mkdir 2>/dev/null
d=
for i in 1 2 3 4 5 6 7 8; do
	t=${TMPDIR:-/tmp}/gatehouse-zsh.$$.$RANDOM$RANDOM
	if zf_mkdir -m 700 $t 2>/dev/null; then d=$t; break; fi
done
if [[ -n $d ]] && builtin print -rn -- "$GATEHOUSE_ZSHENV" >$d/.zshenv && builtin print -rn -- "$GATEHOUSE_ZPROFILE" >$d/.zprofile && builtin print -rn -- "$GATEHOUSE_ZSHRC" >$d/.zshrc; then
	if [[ -n ${ZDOTDIR+set} ]]; then export GATEHOUSE_ZDOTDIR=$ZDOTDIR; fi
	export ZDOTDIR=$d
fi
unset GATEHOUSE_ZSHENV GATEHOUSE_ZPROFILE GATEHOUSE_ZSHRC
exec $SHELL -l -i`
