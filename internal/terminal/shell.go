package terminal

// bashIntegration is the rc file of the terminal's bash: the user's own
// login files first, exactly as "bash -l" reads them, then prompt and
// pre-exec hooks that emit the standard OSC 133 marks: A where a prompt
// starts, B where it ends (typing starts), C where the typed line starts
// running, D;status when it is done. The recording then knows where each
// typed line starts and ends, builtins (cd, export) included. The hooks
// use builtins only, so they start no process (nothing for exec records
// or the audit log). They come from inside the shell, which its user
// controls: they are a convenience for replay, never the audit record
// (that is agentd's exec records, from the kernel).
//
// The first command after the prompt's own (the user's PROMPT_COMMAND
// included, which runs between the two, on lines of its own so whatever
// it ends with still parses) is the typed line: the prompt command ends
// by arming the pre-exec hook.
//
// It holds no single quote: ShellCommand passes it in single quotes.
const bashIntegration = `unset GATEHOUSE_RC
if [ -r /etc/profile ]; then . /etc/profile; fi
if [ -r "$HOME/.bash_profile" ]; then . "$HOME/.bash_profile"
elif [ -r "$HOME/.bash_login" ]; then . "$HOME/.bash_login"
elif [ -r "$HOME/.profile" ]; then . "$HOME/.profile"; fi
__gatehouse_prompt() {
	local s=$?
	if [ -n "$__gatehouse_ran" ]; then printf "\033]133;D;%s\007" "$s"; fi
	__gatehouse_ran=
	__gatehouse_ready=
	printf "\033]133;A\007"
	return $s
}
__gatehouse_preexec() {
	if [ -n "$__gatehouse_ready" ] && [ "${BASH_COMMAND%% *}" != __gatehouse_prompt ]; then
		__gatehouse_ready=
		__gatehouse_ran=1
		printf "\033]133;C\007"
	fi
}
PROMPT_COMMAND="__gatehouse_prompt
${PROMPT_COMMAND}
__gatehouse_ready=1"
PS1="${PS1}\[\033]133;B\007\]"
trap "__gatehouse_preexec" DEBUG
`

// ShellCommand is what a browser terminal runs: the user's login shell
// when it is zsh ($SHELL ends in /zsh and is executable), with the zsh
// integration (see zshBoot), otherwise bash as a login shell with the
// OSC 133 integration (see bashIntegration), or sh where bash is missing.
// Each execs into the shell, so the shell keeps agentd's session leader's
// pid and the programs typed into it are the leader's direct children
// (what becomes terminal.command in the audit log). bash's rc file comes
// through a pipe of the shell's own (process substitution, a fork that
// runs only builtins), so nothing is written to disk; zsh, which reads
// startup files only from a directory, gets a private one that its .zshrc
// removes. It is one constant: pages recognise an interactive terminal by
// comparing a command with it.
const ShellCommand = `case "${SHELL:-}" in */zsh) if [ -x "$SHELL" ]; then export GATEHOUSE_ZSHENV='` + zshEnv +
	`' GATEHOUSE_ZPROFILE='` + zshProfile + `' GATEHOUSE_ZSHRC='` + zshRC + `'; exec "$SHELL" -f -c '` + zshBoot + `'; fi;; esac
if command -v bash >/dev/null 2>&1; then export GATEHOUSE_RC='` + bashIntegration +
	`'; exec bash -c 'exec bash --rcfile <(printf "%s" "$GATEHOUSE_RC") -i'; else exec sh -l; fi`
