package audit

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Filter selects audit events. Zero fields do not filter; set fields are
// combined with AND.
type Filter struct {
	// Actor matches the actor's ID exactly, or the start of the actor's
	// name ignoring case: people type "Jane" or "jane@" and expect
	// jane@example.com. On Postgres the name match walks the index of
	// migration 0012 on lower(actor_name).
	Actor string
	// Action matches actions starting with it: "agent." finds every agent
	// action, "user.login" finds user.login and user.login_failed.
	Action string
	// Target matches the target's ID or name exactly (case-sensitive).
	Target string
	// Decision is Allow, Deny or empty.
	Decision string
	// From is the earliest event time included; zero means unbounded.
	From time.Time
	// Until is the first event time excluded; zero means unbounded.
	Until time.Time
	// Text holds free-text terms; each must occur, case-insensitively, in
	// the action, actor name, target name or details.
	Text []string
	// UpTo, when set, is the highest seq included: a page and its count
	// read against one head of the log, so an event appended between the
	// two (the search's own audit.view among them) is in neither.
	UpTo int64
	// OmitReads leaves out reads of the log itself (LogReads). Review
	// pages set it when the search names no action: otherwise an auditor's
	// own page views crowd out everything else.
	OmitReads bool
	// Query is the search text the filter was parsed from, if any.
	Query string
}

// LeavesGaps reports whether f may leave out events between two it
// keeps: any condition but a time range does. What it selects cannot be
// checked as a hash chain.
func (f Filter) LeavesGaps() bool {
	return f.Actor != "" || f.Action != "" || f.Target != "" || f.Decision != "" || len(f.Text) > 0 || f.OmitReads
}

// LogReads are the actions that record someone reading the log (a page,
// an export, a verification), left out by Filter.OmitReads.
var LogReads = []string{"audit.view", "audit.export", "audit.verify", "audit.checkpoint_export"}

// IsZero reports whether f filters nothing.
func (f Filter) IsZero() bool {
	return f.Actor == "" && f.Action == "" && f.Target == "" && f.Decision == "" &&
		f.From.IsZero() && f.Until.IsZero() && len(f.Text) == 0 && f.UpTo == 0 && !f.OmitReads
}

// maxQuery bounds a search: no stored value it compares with is longer.
const maxQuery = 4 * MaxIndexedText

// MinTextTerm is the shortest free-text term a query accepts.
const MinTextTerm = 3

// ParseQuery reads the review search box syntax:
//
//	actor:jane                actor ID exactly, or name prefix ignoring case
//	action:agent.             action prefix
//	target:"prod box"         target ID or name, exact
//	decision:deny             allow or deny
//	from:2026-01-02           from that day (UTC) or an RFC 3339 instant on
//	to:2026-01-31             through the whole day (UTC) or up to and including an RFC 3339 instant
//	rm -rf                    anything else: free-text terms, all required
//
// Values and free-text phrases may be double-quoted to include spaces.
// A word whose prefix before ":" is not one of the keys above is free text,
// so searching for "http://host" works. Problems are reported as an
// *apperr.ValidationError on the field "q".
func ParseQuery(q string) (Filter, error) {
	f := Filter{Query: q}
	// Postgres cannot compare against NUL or invalid UTF-8; say so rather
	// than fail the query.
	if !utf8.ValidString(q) || strings.IndexByte(q, 0) >= 0 {
		return Filter{}, invalidQuery("The search holds a NUL byte or invalid UTF-8; remove it.")
	}
	if len(q) > maxQuery {
		return Filter{}, invalidQuery("The search is longer than %d bytes; shorten it.", maxQuery)
	}
	toks, ok := tokenize(q)
	if !ok {
		return Filter{}, invalidQuery("A quote is not closed; add the closing \".")
	}
	seen := map[string]bool{}
	for _, t := range toks {
		if t.key == "" {
			// Shorter terms cannot use the trigram index, and a rare one
			// would scan the whole log; an audit search must stay fast at
			// millions of events, so it says so instead.
			if utf8.RuneCountInString(t.value) < MinTextTerm {
				return Filter{}, invalidQuery("Free-text terms need at least %d characters (%q is too short); quote a phrase like \"rm -rf\", or use action:, actor: or target: for exact matches.", MinTextTerm, t.value)
			}
			f.Text = append(f.Text, t.value)
			continue
		}
		if seen[t.key] {
			return Filter{}, invalidQuery("The filter %s: is given twice; give it once.", t.key)
		}
		seen[t.key] = true
		if t.value == "" {
			return Filter{}, invalidQuery("The filter %s: needs a value, like %s.", t.key, example[t.key])
		}
		switch t.key {
		case "actor":
			f.Actor = t.value
		case "action":
			f.Action = t.value
		case "target":
			f.Target = t.value
		case "decision":
			switch strings.ToLower(t.value) {
			case Allow:
				f.Decision = Allow
			case Deny:
				f.Decision = Deny
			default:
				return Filter{}, invalidQuery("Unknown decision %q; use decision:allow or decision:deny.", t.value)
			}
		case "from":
			from, _, err := parseWhen(t.value)
			if err != nil {
				return Filter{}, invalidQuery("from:%s is not a date; use 2026-01-02 or 2026-01-02T15:04:05Z.", t.value)
			}
			f.From = from
		case "to":
			to, isDate, err := parseWhen(t.value)
			if err != nil {
				return Filter{}, invalidQuery("to:%s is not a date; use 2026-01-02 or 2026-01-02T15:04:05Z.", t.value)
			}
			if isDate {
				f.Until = to.AddDate(0, 0, 1)
			} else {
				// Inclusive of the instant itself, at the stored precision.
				f.Until = to.Truncate(time.Microsecond).Add(time.Microsecond)
			}
		}
	}
	if !f.From.IsZero() && !f.Until.IsZero() && !f.From.Before(f.Until) {
		return Filter{}, invalidQuery("from: must be before to:.")
	}
	return f, nil
}

var example = map[string]string{
	"actor": "actor:jane@example.com", "action": "action:agent.", "target": "target:web-1",
	"decision": "decision:deny", "from": "from:2026-01-02", "to": "to:2026-01-31",
}

func invalidQuery(format string, args ...any) error {
	v := apperr.Validation()
	v.Add("q", format, args...)
	return v
}

// parseWhen accepts a date (midnight UTC) or an RFC 3339 instant.
func parseWhen(s string) (t time.Time, isDate bool, err error) {
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t.UTC(), true, nil
	}
	t, err = time.Parse(time.RFC3339Nano, s)
	return t.UTC(), false, err
}

type token struct {
	key   string // "" for free text
	value string
}

// tokenize splits q on spaces outside double quotes; key:value words with
// a known key become filters. It fails only on an unclosed quote.
func tokenize(q string) ([]token, bool) {
	var out []token
	rs := []rune(q)
	for i := 0; i < len(rs); {
		if unicode.IsSpace(rs[i]) {
			i++
			continue
		}
		var word strings.Builder
		quotedAt := -1 // where in word the quoted part begins
		quoted := false
		for ; i < len(rs) && (quoted || !unicode.IsSpace(rs[i])); i++ {
			switch {
			case rs[i] == '"':
				if !quoted && quotedAt < 0 {
					quotedAt = word.Len()
				}
				quoted = !quoted
			default:
				word.WriteRune(rs[i])
			}
		}
		if quoted {
			return nil, false
		}
		w := word.String()
		if k, v, ok := strings.Cut(w, ":"); ok && isKey(k) && (quotedAt < 0 || quotedAt >= len(k)+1) {
			out = append(out, token{key: k, value: v})
			continue
		}
		if w != "" {
			out = append(out, token{value: w})
		}
	}
	return out, true
}

func isKey(k string) bool {
	switch k {
	case "actor", "action", "target", "decision", "from", "to":
		return true
	}
	return false
}

// Default and maximum page sizes for Query.
const (
	DefaultPageSize = 50
	MaxPageSize     = 500
)

// Query returns events matching f, newest first, with seq below before
// (0 = from the newest), at most limit (DefaultPageSize when <= 0, capped
// at MaxPageSize). Paging by the last seq returned is stable while new
// events are appended.
func (l *Log) Query(ctx context.Context, f Filter, before int64, limit int) ([]Event, error) {
	if limit <= 0 {
		limit = DefaultPageSize
	}
	if limit > MaxPageSize {
		limit = MaxPageSize
	}
	return l.page(ctx, f, page{before: before, limit: limit})
}

// Recorded returns events of exactly action done to exactly the target
// of type targetType and ID targetID, newest first, with seq below before
// (0 = from the newest), at most limit. Unlike a Filter nothing matches by
// prefix or by name, so what a check relies on cannot be crowded out by
// look-alikes (audit.checkpoint_export, a target named like another's ID).
func (l *Log) Recorded(ctx context.Context, action, targetType, targetID string, before int64, limit int) ([]Event, error) {
	q := l.db.WithContext(ctx).Table(l.table).Select(columns).
		Where("target_id = ? AND action = ? AND target_type = ?", targetID, action, targetType)
	if before > 0 {
		q = q.Where("seq < ?", before)
	}
	var rows []row
	if err := q.Order("seq DESC").Limit(limit).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("read audit events: %w", err)
	}
	out := make([]Event, len(rows))
	for i, r := range rows {
		out[i] = fromRow(r)
	}
	return out, nil
}

// page is one keyset step: descending below before, or ascending above
// after (and at most upto, when set).
type page struct {
	asc    bool
	before int64
	after  int64
	upto   int64
	limit  int
}

// defaultTextWindow is how many of the newest candidate rows a free-text
// query scans directly before it turns to the trigram index; see textPage.
const defaultTextWindow = 10_000

func (l *Log) page(ctx context.Context, f Filter, p page) ([]Event, error) {
	d := store.DialectOfDB(l.db)
	var rows []row
	var err error
	if d == store.Postgres {
		// The driver caches prepared statements; after a few runs Postgres
		// may switch to a generic plan that cannot see the values, which is
		// what decides between an index and a backwards walk on skewed
		// columns (a rare actor versus "system"). Plan every run.
		err = l.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("SET LOCAL plan_cache_mode = force_custom_plan").Error; err != nil {
				return err
			}
			if len(f.Text) > 0 && !p.asc {
				rows, err = l.textPage(tx, f, p)
				return err
			}
			sql, args := l.buildSQL(d, f, p)
			return tx.Raw(sql, args...).Scan(&rows).Error
		})
	} else {
		sql, args := l.buildSQL(d, f, p)
		err = l.db.WithContext(ctx).Raw(sql, args...).Scan(&rows).Error
	}
	if err != nil {
		return nil, fmt.Errorf("query audit events: %w", err)
	}
	out := make([]Event, len(rows))
	for i, r := range rows {
		out[i] = fromRow(r)
	}
	return out, nil
}

// textPage answers a free-text page on Postgres in two steps, because the
// planner cannot estimate how common a substring is: it may walk the
// primary key back through the whole table for a rare term it took for a
// common one, or collect and sort every match of a common term through the
// trigram index. First the newest l.textWindow rows below the cursor are
// scanned directly, which fills the page for any term matching more than
// about one row in 200. Only if the page is still short is the rest found
// through the trigram index (plain index scans and sequential scans are
// disabled for that statement), where a term that rare has few matches to
// sort. Terms under three characters get no help from trigrams: the second
// step is then left to the planner, and is slow (a scan of the table) when
// such a term is also rare.
func (l *Log) textPage(tx *gorm.DB, f Filter, p page) ([]row, error) {
	hi := p.before - 1
	if f.UpTo > 0 && (p.before <= 0 || f.UpTo < hi) {
		hi = f.UpTo
	} else if p.before <= 0 {
		var head *int64
		if err := tx.Raw("SELECT MAX(seq) FROM " + store.QuoteIdent(l.table)).Scan(&head).Error; err != nil {
			return nil, err
		}
		if head == nil {
			return nil, nil
		}
		hi = *head
	}
	if hi <= 0 {
		return nil, nil
	}
	lo := hi - l.textWindow
	var rows []row
	sql, args := l.buildSQL(store.Postgres, f, page{before: hi + 1, after: max(lo, 0), limit: p.limit})
	if err := tx.Raw(sql, args...).Scan(&rows).Error; err != nil {
		return nil, err
	}
	if len(rows) == p.limit || lo <= 0 {
		return rows, nil
	}
	trigrams := true
	for _, term := range f.Text {
		trigrams = trigrams && utf8.RuneCountInString(term) >= 3
	}
	// Forcing the trigram index for a term it cannot narrow would make
	// Postgres read the whole index; leave such terms to the planner.
	if trigrams {
		if err := tx.Exec("SET LOCAL enable_indexscan = off").Error; err != nil {
			return nil, err
		}
		if err := tx.Exec("SET LOCAL enable_seqscan = off").Error; err != nil {
			return nil, err
		}
	}
	var older []row
	sql, args = l.buildSQL(store.Postgres, f, page{before: lo + 1, limit: p.limit - len(rows)})
	if err := tx.Raw(sql, args...).Scan(&older).Error; err != nil {
		return nil, err
	}
	return append(rows, older...), nil
}

const columns = "seq, occurred_at, actor_type, actor_id, actor_name, source_ip, user_agent, action, " +
	"target_type, target_id, target_name, decision, details, prev_hash, hash"

// searchExpr is the text free-text terms are matched in. On Postgres the
// trigram index of migration 0003 is built on exactly this expression.
const searchExpr = "(action || ' ' || actor_name || ' ' || target_name || ' ' || details)"

type cond struct {
	sql  string
	args []any
}

// buildSQL turns f into one statement. Actor and target each match one of
// two indexed columns; rather than OR them (which Postgres answers with a
// bitmap scan and a sort of every match) each combination becomes its own
// branch walking its (column, seq) index in order, and the branches are
// merged with UNION.
func (l *Log) buildSQL(d store.Dialect, f Filter, p page) (string, []any) {
	t := store.QuoteIdent(l.table)
	var common []cond
	if p.before > 0 {
		common = append(common, cond{"seq < ?", []any{p.before}})
	}
	if p.after > 0 {
		common = append(common, cond{"seq > ?", []any{p.after}})
	}
	if p.upto > 0 {
		common = append(common, cond{"seq <= ?", []any{p.upto}})
	}
	if f.UpTo > 0 {
		common = append(common, cond{"seq <= ?", []any{f.UpTo}})
	}
	if f.OmitReads {
		args := make([]any, len(LogReads))
		for i, a := range LogReads {
			args[i] = a
		}
		common = append(common, cond{"action NOT IN (?" + strings.Repeat(", ?", len(LogReads)-1) + ")", args})
	}
	if f.Action != "" {
		like := "action LIKE ?"
		if d == store.SQLite {
			// SQLite's LIKE ignores ASCII case; GLOB is case-sensitive like
			// Postgres' LIKE and can use the index.
			like = "action GLOB ?"
			common = append(common, cond{like, []any{globEscape(f.Action) + "*"}})
		} else {
			common = append(common, cond{like, []any{likeEscape(f.Action) + "%"}})
		}
	}
	if f.Decision != "" {
		common = append(common, cond{"decision = ?", []any{f.Decision}})
	}
	// Appends keep occurred_at non-decreasing along the chain, so a time
	// range is a seq range; bounding seq lets the planner walk the primary
	// key over just that range instead of from the newest event back.
	if !f.From.IsZero() {
		common = append(common,
			cond{"occurred_at >= ?", []any{f.From}},
			cond{"seq >= (SELECT seq FROM " + t + " WHERE occurred_at >= ? ORDER BY occurred_at, seq LIMIT 1)", []any{f.From}})
	}
	if !f.Until.IsZero() {
		common = append(common,
			cond{"occurred_at < ?", []any{f.Until}},
			cond{"seq <= (SELECT seq FROM " + t + " WHERE occurred_at < ? ORDER BY occurred_at DESC, seq DESC LIMIT 1)", []any{f.Until}})
	}
	for _, term := range f.Text {
		op := "ILIKE"
		esc := ""
		if d == store.SQLite {
			op, esc = "LIKE", ` ESCAPE '\'`
		}
		common = append(common, cond{searchExpr + " " + op + " ?" + esc, []any{"%" + likeEscape(term) + "%"}})
	}
	var alts [][]cond
	if f.Actor != "" {
		// The expression must stay lower(actor_name) for Postgres to use
		// the index of migration 0012.
		name := cond{"lower(actor_name) LIKE ?", []any{strings.ToLower(likeEscape(f.Actor)) + "%"}}
		if d == store.SQLite {
			name.sql += ` ESCAPE '\'`
		}
		alts = append(alts, []cond{{"actor_id = ?", []any{f.Actor}}, name})
	}
	if f.Target != "" {
		alts = append(alts, []cond{{"target_id = ?", []any{f.Target}}, {"target_name = ?", []any{f.Target}}})
	}
	branches := [][]cond{common}
	for _, alt := range alts {
		var next [][]cond
		for _, b := range branches {
			for _, c := range alt {
				nb := append(append([]cond{}, b...), c)
				next = append(next, nb)
			}
		}
		branches = next
	}
	order := "seq DESC"
	if p.asc {
		order = "seq"
	}
	one := func(cs []cond) (string, []any) {
		var sb strings.Builder
		var args []any
		sb.WriteString("SELECT " + columns + " FROM " + t)
		for i, c := range cs {
			if i == 0 {
				sb.WriteString(" WHERE ")
			} else {
				sb.WriteString(" AND ")
			}
			sb.WriteString(c.sql)
			args = append(args, c.args...)
		}
		fmt.Fprintf(&sb, " ORDER BY %s LIMIT %d", order, p.limit)
		return sb.String(), args
	}
	if len(branches) == 1 {
		return one(branches[0])
	}
	var parts []string
	var args []any
	for i, b := range branches {
		s, a := one(b)
		parts = append(parts, fmt.Sprintf("SELECT * FROM (%s) AS b%d", s, i))
		args = append(args, a...)
	}
	return fmt.Sprintf("SELECT * FROM (%s) AS u ORDER BY %s LIMIT %d", strings.Join(parts, " UNION "), order, p.limit), args
}

// likeEscape makes s match literally in a LIKE pattern with the backslash
// escape (Postgres' default; SQLite is told with ESCAPE).
func likeEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

// globEscape makes s match literally in a SQLite GLOB pattern.
func globEscape(s string) string {
	return strings.NewReplacer(`*`, `[*]`, `?`, `[?]`, `[`, `[[]`).Replace(s)
}

// Count counts the events matching f, stopping at limit: an exact count of
// a million-event log would cost more than the page it describes, and past
// a few hundred people refine the search rather than read on. more reports
// that there are more than limit.
func (l *Log) Count(ctx context.Context, f Filter, limit int) (n int, more bool, err error) {
	rows, err := l.page(ctx, f, page{limit: limit + 1})
	if err != nil {
		return 0, false, err
	}
	if len(rows) > limit {
		return limit, true, nil
	}
	return len(rows), false, nil
}

// Search is one review page: the events matching f below before (at most
// limit) and how many match in all (stopping past countLimit), both read
// against the same head of the log, so the count never speaks of an event
// the list cannot show.
func (l *Log) Search(ctx context.Context, f Filter, before int64, limit, countLimit int) (evs []Event, n int, more bool, err error) {
	head, err := l.head(ctx)
	if err != nil || head == 0 {
		return nil, 0, false, err
	}
	if f.UpTo == 0 || f.UpTo > head {
		f.UpTo = head
	}
	if evs, err = l.Query(ctx, f, before, limit); err != nil {
		return nil, 0, false, err
	}
	n, more, err = l.Count(ctx, f, countLimit)
	return evs, n, more, err
}

// SplitDates takes from: and to: dates (whole days) out of a search, so a
// page can show them in date inputs and the rest in the search box;
// JoinDates puts them back. Instants (2026-01-02T15:04:05Z) stay in rest.
func SplitDates(q string) (rest, from, to string) {
	toks, ok := tokenize(q)
	if !ok {
		return q, "", ""
	}
	var parts []string
	for _, t := range toks {
		if _, err := time.Parse(time.DateOnly, t.value); err == nil && (t.key == "from" && from == "" || t.key == "to" && to == "") {
			if t.key == "from" {
				from = t.value
			} else {
				to = t.value
			}
			continue
		}
		parts = append(parts, t.String())
	}
	return strings.Join(parts, " "), from, to
}

// JoinDates adds from: and to: dates (either may be empty) to a search.
func JoinDates(q, from, to string) string {
	for _, kv := range [][2]string{{"from", from}, {"to", to}} {
		if v := strings.TrimSpace(kv[1]); v != "" {
			q = strings.TrimSpace(q + " " + kv[0] + ":" + quote(v))
		}
	}
	return q
}

// String writes the token back in search syntax.
func (t token) String() string {
	if t.key == "" {
		// Free text that looks like a filter was quoted to stay free text.
		if k, _, ok := strings.Cut(t.value, ":"); ok && isKey(k) {
			return `"` + t.value + `"`
		}
		return quote(t.value)
	}
	return t.key + ":" + quote(t.value)
}

// quote wraps a value holding spaces in double quotes.
func quote(v string) string {
	if strings.IndexFunc(v, unicode.IsSpace) >= 0 {
		return `"` + v + `"`
	}
	return v
}
