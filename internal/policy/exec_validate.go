package policy

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/gatehouse/gatehouse/internal/apperr"
)

// Validate reports what is wrong with p, normalized, as an
// *apperr.ValidationError keyed by field ("default", "rules[2].program");
// each rule's message names it ("Rule 3: …"). Nil when p is valid.
func (p *Exec) Validate() error {
	v := apperr.Validation()
	p.ValidateInto(v, "")
	return v.Err()
}

// ValidateInto adds what is wrong with p, normalized, to v, with each
// field key prefixed by prefix (e.g. "exec_policy.").
func (p *Exec) ValidateInto(v *apperr.ValidationError, prefix string) {
	q := *p
	q.ExecPaths = append([]string(nil), p.ExecPaths...)
	q.Normalize()
	if !q.Default.Valid() {
		v.Add(prefix+"default", "The default must be allow, ask or deny, not %q.", q.Default)
	}
	if !q.Dynamic.Valid() {
		v.Add(prefix+"dynamic", "dynamic (for what is known only when it runs) must be ask, deny or allow, not %q.", q.Dynamic)
	}
	if t := q.ApprovalTimeoutSeconds; t < MinApprovalTimeoutSeconds || t > MaxApprovalTimeoutSeconds {
		v.Add(prefix+"approval_timeout_seconds", "The approval timeout must be between %d and %d seconds (a minute to a day), not %d.", MinApprovalTimeoutSeconds, MaxApprovalTimeoutSeconds, t)
	}
	if len(q.ExecPaths) > 0 && q.Default != Deny {
		v.Add(prefix+"exec_paths", "exec_paths limit programs to some directories, which only makes sense with default deny; set the default to deny or remove them.")
	}
	if len(q.ExecPaths) > MaxExecPaths {
		v.Add(prefix+"exec_paths", "At most %d exec paths.", MaxExecPaths)
	}
	for i, d := range q.ExecPaths {
		if !strings.HasPrefix(d, "/") || hasDotDot(d) || len(d) > 4096 || hasControl(d) {
			v.Add(fmt.Sprintf("%sexec_paths[%d]", prefix, i), "Exec path %q must be an absolute directory path without \"..\".", d)
		}
	}
	if len(q.Rules) > MaxExecRules {
		v.Add(prefix+"rules", "At most %d rules (there are %d).", MaxExecRules, len(q.Rules))
	}
	for i, r := range q.Rules {
		validateExecRule(v, fmt.Sprintf("%srules[%d].", prefix, i), fmt.Sprintf("Rule %d: ", i+1), r)
	}
}

func validateExecRule(v *apperr.ValidationError, key, name string, r ExecRule) {
	if !r.Action.Valid() {
		v.Add(key+"action", "%sthe action must be allow, ask or deny, not %q.", name, r.Action)
	}
	if len(r.Reason) > MaxReason {
		v.Add(key+"reason", "%sthe reason must be at most %d characters.", name, MaxReason)
	}
	if r.Text != "" {
		switch {
		case r.Program != "" || r.Args != "" || r.SHA256 != "":
			v.Add(key+"text", "%sa text pattern stands alone: put program, args and sha256 in a rule of their own.", name)
		case len(r.Text) > MaxPattern:
			v.Add(key+"text", "%sthe text pattern must be at most %d characters.", name, MaxPattern)
		case r.Action == Allow:
			v.Add(key+"action", "%sa text pattern can only deny or ask: the text of a command cannot vouch for what it runs.", name)
		}
		if _, err := regexp.Compile(r.Text); err != nil {
			v.Add(key+"text", "%sthe text pattern %q is not a valid regular expression (%v).", name, r.Text, err)
		}
		return
	}
	if r.Program == "" && r.SHA256 == "" {
		v.Add(key+"program", "%sprogram and sha256 are both empty; name a program (\"git\", \"/usr/bin/*\", \"*\" for every program), its sha256, or give a text pattern.", name)
	}
	if g := r.Program; g != "" {
		_, err := path.Match(g, "")
		switch {
		case len(g) > MaxPattern:
			v.Add(key+"program", "%sthe program must be at most %d characters.", name, MaxPattern)
		case hasControl(g):
			v.Add(key+"program", "%sthe program must not contain control characters.", name)
		case strings.Contains(g, "/") && !strings.HasPrefix(g, "/"):
			v.Add(key+"program", "%sthe program %q has a slash, so it must be an absolute path (\"/usr/bin/rm\"), or a name without one (\"rm\").", name, g)
		case hasDotDot(g):
			v.Add(key+"program", "%sthe program %q must not contain \"..\".", name, g)
		case err != nil:
			v.Add(key+"program", "%sthe program %q is not a valid glob (check its [ ] and \\).", name, g)
		}
	}
	if r.Args != "" {
		if len(r.Args) > MaxPattern {
			v.Add(key+"args", "%sargs must be at most %d characters.", name, MaxPattern)
		}
		for _, w := range strings.Fields(r.Args) {
			if checkGlob(w) != nil {
				v.Add(key+"args", "%sthe args word %q is not a valid glob (check its [ ] and \\).", name, w)
				break
			}
		}
	}
	if r.SHA256 != "" && !isSHA256(r.SHA256) {
		v.Add(key+"sha256", "%ssha256 must be 64 hexadecimal digits.", name)
	}
}

func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isHex(s[i]) {
			return false
		}
	}
	return true
}

func hasControl(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0
}

// ParseExec reads an execution policy from JSON as a person or the API
// wrote it, refusing unknown fields, and returns it normalized; problems
// go to v under field (the whole document) and field + ".rules[2].program"
// and the like. An empty document is DefaultExec.
func ParseExec(raw string, v *apperr.ValidationError, field string) Exec {
	p := DefaultExec()
	if strings.TrimSpace(raw) == "" {
		return p
	}
	if !decodeStrict(raw, &p, v, field, "The execution policy",
		"default, dynamic, approval_timeout_seconds, require_enforcement, exec_paths, rules[{action, program, args, sha256, text, reason}]") {
		return p
	}
	p.Normalize()
	p.ValidateInto(v, prefixOf(field))
	return p
}

func prefixOf(field string) string {
	if field == "" {
		return ""
	}
	return field + "."
}

func decodeStrict(raw string, dst any, v *apperr.ValidationError, field, what, allowed string) bool {
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		v.Add(field, "%s Allowed fields: %s.", apperr.DescribeJSON(what, err), allowed)
		return false
	}
	if dec.More() {
		v.Add(field, "%s must be a single JSON object.", what)
		return false
	}
	return true
}
