package policy

import (
	"path"
	"slices"
	"strings"

	"github.com/gatehouse/gatehouse/internal/clip"

	"mvdan.cc/sh/v3/syntax"
)

// Limits of the walk over one command line.
const (
	// MaxCommandBytes bounds a command line the gateway parses.
	MaxCommandBytes = 256 << 10
	// maxDepth bounds shells within shells (bash -c "bash -c '…'").
	maxDepth = 12
	// maxCommands bounds the simple commands checked on one line.
	maxCommands = 4096
	// maxCodeBytes bounds the code parsed for one line, nested strings
	// (bash -c, eval, here-documents) included.
	maxCodeBytes = 4 * MaxCommandBytes
	// maxLineBraceWords bounds the words brace expansion makes on one line.
	maxLineBraceWords = 4096
)

// walker finds every simple command a line may run and decides each.
type walker struct {
	c      *Checker
	parser *syntax.Parser
	out    []Command
	// redefined are names the line makes aliases or functions of, or
	// hashes to another file: a command of that name is not the program
	// of that name.
	redefined map[string]string
	commands  int
	// codeBytes and braceWords count the work done, against the limits.
	codeBytes, braceWords int
}

// scope is where in the line a command sits.
type scope struct {
	src   string   // the source text the syntax nodes point into
	via   []string // shells, wrappers and substitutions, outermost first
	depth int
}

func (sc *scope) slice(n syntax.Node) string {
	a, b := n.Pos().Offset(), n.End().Offset()
	if !n.Pos().IsValid() || !n.End().IsValid() || a > b || b > uint(len(sc.src)) {
		return ""
	}
	return sc.src[a:b]
}

// inside is the scope of what label runs.
func (sc *scope) inside(label string) *scope {
	return &scope{src: sc.src, via: append(slices.Clip(sc.via), label), depth: sc.depth + 1}
}

func newWalker(c *Checker) *walker {
	parser, _ := c.parsers.Get().(*syntax.Parser)
	if parser == nil {
		parser = syntax.NewParser(syntax.Variant(syntax.LangBash))
	}
	return &walker{c: c, parser: parser, redefined: map[string]string{}}
}

// done returns the walker's parser for reuse.
func (w *walker) done() { w.c.parsers.Put(w.parser) }

// parse parses a command line as bash does (a superset, for this purpose,
// of what sh, dash and busybox accept).
func (w *walker) parse(src string) (*syntax.File, error) {
	return w.parser.Parse(strings.NewReader(src), "")
}

// placeholder stands, in code that is partly known, for what is known
// only when it runs, so the known rest can still be checked.
const placeholder = "${__unknown}"

// code walks commands given as text to a shell, eval, trap, alias… Where
// part of the text is known only when it runs, that part may be any code:
// the text is decided by the dynamic setting, and the rest is checked
// too, so what it surely runs is decided by its rules.
func (w *walker) code(v word, sc *scope, label string) {
	inner := sc.inside(label)
	if inner.depth > maxDepth {
		w.dynamic(sc, label, "the commands are nested too deeply to check")
		return
	}
	src := v.text
	if v.glob {
		src = unknownPart
	}
	if w.codeBytes += len(src); w.codeBytes > maxCodeBytes {
		w.dynamic(sc, label, "the line holds too much code to check")
		return
	}
	partial := strings.Contains(src, unknownPart)
	if partial {
		w.dynamic(sc, label+" "+shorten(v.src, 60), "the commands given to "+label+" include `"+shorten(v.src, 60)+"`, known only when it runs")
		if strings.Trim(src, unknownPart+" \t\n") == "" {
			return
		}
		src = strings.ReplaceAll(src, unknownPart, placeholder)
	}
	f, err := w.parse(src)
	if err != nil {
		if !partial {
			w.dynamic(sc, label+" "+shorten(src, 60), "the commands given to "+label+" do not parse ("+parseMessage(err)+")")
		}
		return
	}
	inner.src = src
	w.file(f, inner)
}

func (w *walker) file(f *syntax.File, sc *scope) {
	// A function or alias defined anywhere on the line may be what a
	// command of its name runs, wherever it stands. Without "alias",
	// "function" or "(" the text defines neither.
	if strings.Contains(sc.src, "alias") || strings.Contains(sc.src, "function") || strings.Contains(sc.src, "(") {
		w.prepass(f)
	}
	w.stmts(f.Stmts, sc)
}

func (w *walker) prepass(f *syntax.File) {
	syntax.Walk(f, func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.FuncDecl:
			if n.Name != nil {
				w.redefined[n.Name.Value] = "a function defined on this line"
			}
			for _, l := range n.Names {
				w.redefined[l.Value] = "a function defined on this line"
			}
		case *syntax.CallExpr:
			if len(n.Args) > 1 && n.Args[0].Lit() == "alias" {
				for _, a := range n.Args[1:] {
					if name, _, ok := strings.Cut(resolveWord(a).text, "="); ok {
						w.redefined[name] = "an alias defined on this line"
					}
				}
			}
		}
		return true
	})
}

func (w *walker) stmts(list []*syntax.Stmt, sc *scope) {
	for _, s := range list {
		w.stmt(s, sc)
	}
}

func (w *walker) stmt(s *syntax.Stmt, sc *scope) {
	for _, r := range s.Redirs {
		w.substs(r.Word, sc)
		w.substs(r.Hdoc, sc)
	}
	switch c := s.Cmd.(type) {
	case nil:
	case *syntax.CallExpr:
		w.call(c, s.Redirs, sc)
	case *syntax.BinaryCmd:
		w.stmt(c.X, sc)
		w.stmt(c.Y, sc)
	case *syntax.FuncDecl:
		name := ""
		if c.Name != nil {
			name = c.Name.Value
		}
		w.stmt(c.Body, sc.inside("function "+name))
	case *syntax.TimeClause:
		if c.Stmt != nil {
			w.stmt(timed(c.Stmt), sc)
		}
	case *syntax.CoprocClause:
		w.substs(c.Name, sc)
		w.stmt(c.Stmt, sc)
	case *syntax.DeclClause:
		w.decl(c, sc)
	default:
		// Compound commands: if, while, for, case, blocks, subshells,
		// [[ ]], (( )), let. Their statements are walked, and their
		// words checked for what bash may evaluate.
		syntax.Walk(c, func(n syntax.Node) bool {
			switch n := n.(type) {
			case *syntax.Stmt:
				w.stmt(n, sc)
				return false
			case *syntax.CmdSubst:
				w.subst(n, sc)
				return false
			case *syntax.ProcSubst:
				w.stmts(n.Stmts, sc.inside(procLabel(n)))
				return false
			case *syntax.ParamExp:
				if promptExpansion(n) {
					w.promptDynamic(n, sc)
				}
			case *syntax.Word:
				w.subscript(resolveWord(n), sc)
			}
			return true
		})
	}
}

// timed is what the time keyword runs: bash 5.2 takes a `--` after time
// (and after time -p) as the end of its options, which the parser reads
// as the program `--`.
func timed(s *syntax.Stmt) *syntax.Stmt {
	c, ok := s.Cmd.(*syntax.CallExpr)
	if !ok || len(c.Args) == 0 || c.Args[0].Lit() != "--" {
		return s
	}
	cp := *s
	call := *c
	call.Args = c.Args[1:]
	cp.Cmd = &call
	return &cp
}

// promptExpansion reports a ${name@P} expansion, which expands its value
// as a prompt string: command substitutions in the value run.
func promptExpansion(n *syntax.ParamExp) bool {
	return n.Exp != nil && n.Exp.Op == syntax.OtherParamOps && n.Exp.Word != nil && strings.Contains(n.Exp.Word.Lit(), "P")
}

// promptDynamic records a ${name@P} expansion as code known only when it
// runs.
func (w *walker) promptDynamic(n *syntax.ParamExp, sc *scope) {
	w.dynamic(sc, sc.slice(n), "`"+sc.slice(n)+"` expands the variable as a prompt, which runs the command substitutions its value holds, known only when it runs")
}

// substs walks the command and process substitutions inside n, which run
// before (or while) the command they are part of.
func (w *walker) substs(n syntax.Node, sc *scope) {
	switch n := n.(type) {
	case nil:
		return
	case *syntax.Word:
		if n == nil {
			return
		}
	case *syntax.ArrayExpr:
		if n == nil {
			return
		}
	case *syntax.Stmt:
		if n == nil {
			return
		}
	}
	syntax.Walk(n, func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.CmdSubst:
			w.subst(n, sc)
			return false
		case *syntax.ProcSubst:
			w.stmts(n.Stmts, sc.inside(procLabel(n)))
			return false
		case *syntax.Stmt:
			w.stmt(n, sc)
			return false
		case *syntax.ParamExp:
			if promptExpansion(n) {
				w.promptDynamic(n, sc)
			}
		}
		return true
	})
}

func (w *walker) subst(n *syntax.CmdSubst, sc *scope) {
	label := "$(…)"
	if n.Backquotes {
		label = "`…`"
	}
	w.stmts(n.Stmts, sc.inside(label))
}

func procLabel(n *syntax.ProcSubst) string {
	if n.Op == syntax.CmdOut {
		return ">(…)"
	}
	return "<(…)"
}

// decl walks declare, local, export, readonly and typeset.
func (w *walker) decl(c *syntax.DeclClause, sc *scope) {
	name := c.Variant.Value
	for _, a := range c.Args {
		w.substs(a.Value, sc)
		w.substs(a.Array, sc)
		if a.Value == nil {
			continue
		}
		v := resolveWord(a.Value)
		w.subscript(v, sc)
		switch {
		case a.Naked && !v.known():
			w.dynamic(sc, sc.slice(c), name+" is given `"+sc.slice(a.Value)+"`, known only when it runs, and evaluates what it names")
		case a.Name != nil && runsCode(a.Name.Value) != "":
			w.dynamic(sc, sc.slice(c), "it sets "+a.Name.Value+", which "+runsCode(a.Name.Value))
		case v.known() && runsCode(v.text) != "":
			// declare -n ref=PS4: assigning to ref sets PS4.
			w.dynamic(sc, sc.slice(c), name+" may make a reference to "+v.text+", which "+runsCode(v.text))
		}
	}
	w.run([]word{{text: name, src: name}}, stdin{}, sc, true, sc.slice(c), "")
}

// call walks one simple command: the substitutions in its words, then
// the command itself.
func (w *walker) call(c *syntax.CallExpr, redirs []*syntax.Redirect, sc *scope) {
	extra := ""
	for _, a := range c.Assigns {
		w.substs(a.Value, sc)
		w.substs(a.Array, sc)
		w.substs(a.Index, sc)
		if a.Value != nil {
			w.subscript(resolveWord(a.Value), sc)
		}
		if a.Name != nil && runsCode(a.Name.Value) != "" {
			if len(c.Args) == 0 {
				w.dynamic(sc, sc.slice(c), "it sets "+a.Name.Value+", which "+runsCode(a.Name.Value))
			} else {
				extra = "`" + sc.slice(a) + "` " + runsCode(a.Name.Value)
			}
		}
	}
	for _, a := range c.Args {
		w.substs(a, sc)
	}
	if len(c.Args) == 0 {
		return
	}
	text := sc.slice(c)
	w.run(w.words(sc, c.Args), stdinOf(redirs, sc), sc, true, text, extra)
}

// runsCode says how setting the variable name makes a program run code
// the line does not show; "" for an ordinary variable.
func runsCode(name string) string {
	switch {
	case name == "BASH_ENV" || name == "ENV":
		return "makes the shell first run the file it names"
	case name == "LD_PRELOAD" || name == "LD_AUDIT":
		return "loads the library it names into the program"
	case strings.HasPrefix(name, "BASH_FUNC_"):
		return "defines a function for the shell it starts"
	case name == "PS0" || name == "PS1" || name == "PS2" || name == "PS3" || name == "PS4" || name == "PROMPT_COMMAND":
		return "is a prompt the shell expands, running the command substitutions it holds (PS4 with set -x; PROMPT_COMMAND runs as code)"
	case strings.HasPrefix(name, "GIT_CONFIG") || name == "GIT_PAGER" || name == "PAGER" || name == "GIT_EDITOR" || name == "EDITOR" || name == "VISUAL" ||
		name == "GIT_SSH" || name == "GIT_SSH_COMMAND" || name == "GIT_ASKPASS" || name == "SSH_ASKPASS" || name == "GIT_EXTERNAL_DIFF" ||
		name == "GIT_PROXY_COMMAND" || name == "GIT_EXEC_PATH" || name == "GIT_TEMPLATE_DIR":
		return "names a program (or configuration that names one) that git and other tools run"
	case name == "PYTHONSTARTUP" || name == "PYTHONPATH" || name == "PERL5OPT" || name == "PERL5LIB" || name == "NODE_OPTIONS" || name == "RUBYOPT":
		return "makes the interpreter load code it names"
	}
	return ""
}

// subscript flags a quoted string that hides a command substitution in an
// array subscript: bash runs it wherever it evaluates the string as
// arithmetic (test -v, [[ -eq ]], let, declare, (( ))).
func (w *walker) subscript(v word, sc *scope) {
	if i := strings.IndexByte(v.text, '['); i >= 0 && (strings.Contains(v.text[i:], "$(") || strings.Contains(v.text[i:], "`")) {
		w.dynamic(sc, v.src, "bash runs the command substitution in this array subscript when it evaluates it as arithmetic")
	}
}

// settersByName are builtins that assign to the variables their
// arguments name (printf -v, read, mapfile): naming one that runs code
// (PS4) is setting it.
var settersByName = setOf("printf", "read", "mapfile", "readarray")

// arithBuiltins evaluate (some of) their arguments as arithmetic or as
// variable names with subscripts.
var arithBuiltins = setOf("test", "[", "let", "unset", "printf", "read", "wait", "mapfile", "readarray",
	"declare", "typeset", "local", "export", "readonly")

// stdin is what a command reads on its standard input, when a shell
// may run it: code when it is given on the line (a here-document or a
// here-string, perhaps with expansions), else where it comes from.
type stdin struct {
	code word
	ok   bool
	from string
}

// stdinOf finds a command's standard input among its redirections.
func stdinOf(redirs []*syntax.Redirect, sc *scope) stdin {
	in := stdin{from: "its standard input"}
	for _, r := range redirs {
		if r.N != nil && r.N.Value != "0" {
			continue
		}
		switch r.Op {
		case syntax.Hdoc, syntax.DashHdoc:
			in = stdin{code: heredoc(r, sc), ok: true}
		case syntax.WordHdoc:
			v := resolveWord(r.Word)
			v.src = sc.slice(r.Word)
			v.text += "\n"
			in = stdin{code: v, ok: true}
		case syntax.RdrIn, syntax.RdrInOut, syntax.DplIn:
			in = stdin{from: "the file " + sc.slice(r.Word)}
		}
	}
	return in
}

// dynamic records something that runs but cannot be known before it
// does, decided as an unknown program.
func (w *walker) dynamic(sc *scope, text, why string) {
	if !w.count(sc, text) {
		return
	}
	w.record(sc, text, why)
}

func (w *walker) record(sc *scope, text, why string) {
	text = strings.ReplaceAll(text, placeholder, "…")
	w.out = append(w.out, Command{
		Text: text, Program: text, Via: slices.Clone(sc.via), Unknown: why,
		Decision: w.c.decideTarget(target{unknown: why}),
	})
}

// run decides one command given as resolved words (a simple command, or
// what a wrapper runs), then what it runs in turn. shell says the shell
// itself runs it (builtins, functions and aliases apply); extra, when set,
// is why the program runs code the line does not show.
func (w *walker) run(words []word, in stdin, sc *scope, shell bool, text, extra string) {
	if len(words) == 0 || !w.count(sc, text) {
		return
	}
	if sc.depth > maxDepth {
		// What it runs is not followed further: it is unknown, not
		// allowed.
		w.record(sc, text, "the commands are nested too deeply to check")
		return
	}
	p := words[0]
	cmd := Command{Text: text, Via: slices.Clone(sc.via)}
	for _, a := range words[1:] {
		if a.known() {
			cmd.Args = append(cmd.Args, a.text)
		} else {
			cmd.Args = append(cmd.Args, a.src)
		}
	}
	var t target
	for _, a := range words[1:] {
		t.args = append(t.args, a.arg())
	}
	switch {
	case p.glob:
		t.unknown = "the program is the file name pattern `" + p.src + "`, which names a file only when it runs"
		cmd.Program = p.src
	case p.split:
		t.unknown = "the program is `" + p.src + "`, known only when it runs"
		cmd.Program = p.src
	case p.unknown:
		// "$HOME/bin/rm": the directory is unknown, the name is not.
		cmd.Program = p.src
		if i := strings.LastIndexByte(p.text, '/'); i > strings.LastIndexByte(p.text, 0) {
			t.name = p.text[i+1:]
		} else {
			t.unknown = "the program is `" + p.src + "`, known only when it runs"
		}
	case p.text == "":
		return // an empty command name runs nothing
	case strings.Contains(p.text, "/"):
		clean := path.Clean(p.text)
		t.name = path.Base(clean)
		cmd.Program = clean
		if strings.HasPrefix(clean, "/") {
			t.path = clean
		} else if clean != ".." && !strings.HasPrefix(clean, "../") {
			cmd.Program = "./" + clean
		}
	default:
		t.name = p.text
		cmd.Program = p.text
	}
	cmd.Name = t.name
	if strings.Contains(text, placeholder) {
		// Shown as what it stands for.
		cmd.Text = strings.ReplaceAll(cmd.Text, placeholder, "…")
		cmd.Program = strings.ReplaceAll(cmd.Program, placeholder, "…")
		for i, a := range cmd.Args {
			cmd.Args[i] = strings.ReplaceAll(a, placeholder, "…")
		}
	}
	redefined := ""
	if shell && t.path == "" && !strings.Contains(p.text, "/") && t.name != "" {
		if why, ok := w.redefined[t.name]; ok {
			redefined = why
			t.unknown = "`" + t.name + "` may be " + why + ", so what it runs is known only when it runs"
		} else if builtins[t.name] {
			t.builtin = true
		}
	}
	if t.builtin && arithBuiltins[t.name] {
		for _, a := range words[1:] {
			w.subscript(a, sc)
		}
	}
	if t.builtin && settersByName[t.name] {
		for _, a := range words[1:] {
			if why := runsCode(a.text); a.known() && why != "" {
				w.dynamic(sc, text, t.name+" may set "+a.text+", which "+why)
			}
		}
	}
	if t.builtin && t.name == "fc" && !slices.ContainsFunc(words[1:], func(a word) bool { return a.known() && strings.HasPrefix(a.text, "-") && strings.Contains(a.text, "l") }) {
		w.dynamic(sc, text, "fc runs commands from the shell's history (which history -s and history -r fill), known only when it runs")
	}
	if extra != "" && t.unknown == "" {
		t.unknown = extra
	}
	cmd.Unknown = t.unknown
	cmd.Decision = w.c.decideTarget(t)
	w.out = append(w.out, cmd)
	if t.name == "" || redefined != "" {
		return
	}
	w.unwrap(t.name, words[1:], in, sc, shell, text)
}

// count counts one more command against the line's budget: past it,
// one entry says the rest is unknown, and nothing more is recorded.
func (w *walker) count(sc *scope, text string) bool {
	w.commands++
	if w.commands == maxCommands+1 {
		w.record(sc, shorten(text, 60), "the line holds too many commands to check")
	}
	return w.commands <= maxCommands
}

// shorten cuts s to about n bytes for an explanation.
func shorten(s string, n int) string { return clip.String(strings.TrimSpace(s), n) }

// joinWords joins words with spaces into one string of code, as eval and
// watch do; a file name pattern becomes unknown, as the file names it
// expands to are spliced into the code.
func joinWords(ws []word) word {
	texts := make([]string, len(ws))
	for i, a := range ws {
		texts[i] = a.text
		if a.glob {
			texts[i] = unknownPart
		}
	}
	return word{text: strings.Join(texts, " "), src: srcOf(ws)}
}

func srcOf(ws []word) string {
	parts := make([]string, len(ws))
	for i, a := range ws {
		parts[i] = a.src
	}
	return strings.Join(parts, " ")
}
