package handlers

import (
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/policy"
	"github.com/gatehouse/gatehouse/internal/views"
)

// An agent's execution policy: its JSON in the API, the rules table of the
// agent page, and the "try a command" box (API and page).

type execTryRequest struct {
	Command string            `json:"command"`
	Env     map[string]string `json:"env"`
	// ExecPolicy, when given, is tried instead of the agent's (a draft).
	ExecPolicy json.RawMessage `json:"exec_policy"`
}

type execDecisionJSON struct {
	Action policy.Action `json:"action"`
	// Rule is the deciding rule's index in exec_policy.rules; null when
	// the default or the dynamic setting decided.
	Rule *int   `json:"rule"`
	Why  string `json:"why"`
}

func decisionJSON(d policy.Decision) execDecisionJSON {
	out := execDecisionJSON{Action: d.Action, Why: d.Why}
	if d.Rule >= 0 {
		r := d.Rule
		out.Rule = &r
	}
	return out
}

type execCommandJSON struct {
	Text    string   `json:"text"`
	Program string   `json:"program"`
	Args    []string `json:"args"`
	Via     []string `json:"via"`
	Unknown string   `json:"unknown"`
	execDecisionJSON
	Explain string `json:"explain"`
}

type execTextJSON struct {
	On string `json:"on"`
	execDecisionJSON
}

type execTryJSON struct {
	execDecisionJSON
	Explain           string            `json:"explain"`
	ExecPolicyVersion string            `json:"exec_policy_version"`
	Commands          []execCommandJSON `json:"commands"`
	Texts             []execTextJSON    `json:"texts"`
}

func toExecTryJSON(d policy.CommandDecision, version string) execTryJSON {
	out := execTryJSON{execDecisionJSON: decisionJSON(d.Decision), Explain: d.Explain(), ExecPolicyVersion: version,
		Commands: []execCommandJSON{}, Texts: []execTextJSON{}}
	for _, c := range d.Commands {
		args, via := c.Args, c.Via
		if args == nil {
			args = []string{}
		}
		if via == nil {
			via = []string{}
		}
		out.Commands = append(out.Commands, execCommandJSON{Text: c.Text, Program: c.Program, Args: args, Via: via, Unknown: c.Unknown,
			execDecisionJSON: decisionJSON(c.Decision), Explain: c.Explain()})
	}
	for _, t := range d.Texts {
		out.Texts = append(out.Texts, execTextJSON{On: t.On, execDecisionJSON: decisionJSON(t.Decision)})
	}
	return out
}

// tryExec decides req's command by a's execution policy (or the draft req
// carries), as an exec would be.
func tryExec(a agents.Agent, req execTryRequest) (execTryJSON, error) {
	p, err := a.Exec()
	if err != nil {
		return execTryJSON{}, err
	}
	if len(req.ExecPolicy) > 0 && string(req.ExecPolicy) != "null" {
		v := apperr.Validation()
		p = policy.ParseExec(string(req.ExecPolicy), v, "exec_policy")
		if err := v.Err(); err != nil {
			return execTryJSON{}, err
		}
	}
	d, err := agents.Try(p, req.Command, req.Env)
	if err != nil {
		return execTryJSON{}, err
	}
	return toExecTryJSON(d, p.Digest()), nil
}

// apiTryExec: whoever may read the agent may try its policy; the agent is
// read (and the caller authorized) before the body is.
func (s *Server) apiTryExec(c echo.Context) error {
	a, err := s.agentFromPath(c)
	if err != nil {
		return err
	}
	return jsonCall(c, http.StatusOK, func(req execTryRequest) (execTryJSON, error) { return tryExec(a, req) })
}

// pageTryExec answers the agent page's "try a command" box with the
// agent's page showing the decision.
func (s *Server) pageTryExec(c echo.Context) error {
	a, err := s.agentFromPath(c)
	if err != nil {
		return err
	}
	try := views.ExecTry{Command: c.FormValue("command"), Tried: true}
	out, err := tryExec(a, execTryRequest{Command: try.Command})
	status := http.StatusOK
	if fields, st, ok := formFailure(err); ok {
		status, try.Error = st, fields["form"]
		if try.Error == "" {
			try.Error = fields["command"]
		}
	} else if err != nil {
		return err
	} else {
		try.Action, try.Explain = string(out.Action), out.Explain
		for _, cmd := range out.Commands {
			try.Commands = append(try.Commands, views.ExecTryCommand{Text: cmd.Text, Via: strings.Join(cmd.Via, " › "), Action: string(cmd.Action), Why: cmd.Why, Unknown: cmd.Unknown})
		}
		for _, t := range out.Texts {
			try.Commands = append(try.Commands, views.ExecTryCommand{Text: "(text rule on " + t.On + ")", Action: string(t.Action), Why: t.Why})
		}
	}
	return s.renderAgentTried(c, status, a, nil, &try)
}

// blankRuleRows is how many empty rows the rules table offers for new
// rules (more after each save).
const blankRuleRows = 3

// execPolicyForm is the rules table of p, with blank rows to add rules.
func execPolicyForm(p policy.Exec) views.ExecPolicyForm {
	f := views.ExecPolicyForm{Default: string(p.Default), Dynamic: string(p.Dynamic), TimeoutSeconds: p.ApprovalTimeoutSeconds}
	for i, r := range p.Rules {
		f.Rules = append(f.Rules, views.ExecRuleRow{Order: i + 1, Action: string(r.Action), Program: r.Program, Args: r.Args, Text: r.Text, SHA256: r.SHA256, Reason: r.Reason})
	}
	return withBlankRows(f)
}

func withBlankRows(f views.ExecPolicyForm) views.ExecPolicyForm {
	n := len(f.Rules)
	for i := range blankRuleRows {
		f.Rules = append(f.Rules, views.ExecRuleRow{Order: n + i + 1, Action: string(policy.Deny), Blank: true})
	}
	return f
}

// execPolicyFromForm reads the rules table: rows in the order of their
// order numbers (ties keep the table's order), rows set to "remove" or
// left blank dropped. ok is false when the form has no rules table (a
// client of the older form), which leaves the policy as it is.
func execPolicyFromForm(c echo.Context) (p policy.Exec, f views.ExecPolicyForm, ok bool) {
	form := c.Request().PostForm
	if _, ok := form["exec_default"]; !ok {
		return p, f, false
	}
	col := func(name string, i int) string {
		if vs := form[name]; i < len(vs) {
			return strings.TrimSpace(vs[i])
		}
		return ""
	}
	type row struct {
		order int
		views.ExecRuleRow
	}
	var rows []row
	for i := range form["rule_action"] {
		r := views.ExecRuleRow{Action: col("rule_action", i), Program: col("rule_program", i), Args: col("rule_args", i),
			Text: col("rule_text", i), SHA256: col("rule_sha256", i), Reason: col("rule_reason", i)}
		if r.Action == "remove" || r.Program == "" && r.Args == "" && r.Text == "" && r.SHA256 == "" && r.Reason == "" {
			continue
		}
		order, err := strconv.Atoi(col("rule_order", i))
		if err != nil {
			order = i + 1
		}
		rows = append(rows, row{order: order, ExecRuleRow: r})
	}
	slices.SortStableFunc(rows, func(a, b row) int { return a.order - b.order })
	secs, _ := strconv.Atoi(c.FormValue("exec_timeout_seconds"))
	p = policy.Exec{Default: policy.Action(c.FormValue("exec_default")), Dynamic: policy.Action(c.FormValue("exec_dynamic")),
		ApprovalTimeoutSeconds: secs, Rules: []policy.ExecRule{}}
	f = views.ExecPolicyForm{Default: string(p.Default), Dynamic: string(p.Dynamic), TimeoutSeconds: secs}
	for i, r := range rows {
		p.Rules = append(p.Rules, policy.ExecRule{Action: policy.Action(r.Action), Program: r.Program, Args: r.Args, Text: r.Text, SHA256: r.SHA256, Reason: r.Reason})
		r.Order = i + 1
		f.Rules = append(f.Rules, r.ExecRuleRow)
	}
	return p, withBlankRows(f), true
}

var ruleErrorKey = regexp.MustCompile(`^exec_policy\.rules\[(\d+)\]\.`)

// withRuleErrors puts each rule's validation messages on its row.
func withRuleErrors(f views.ExecPolicyForm, errs map[string]string) views.ExecPolicyForm {
	for k, msg := range errs {
		m := ruleErrorKey.FindStringSubmatch(k)
		if m == nil {
			continue
		}
		if i, err := strconv.Atoi(m[1]); err == nil && i < len(f.Rules) {
			f.Rules[i].Errors = append(f.Rules[i].Errors, msg)
			slices.Sort(f.Rules[i].Errors)
		}
	}
	return f
}
