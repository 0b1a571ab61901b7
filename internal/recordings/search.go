package recordings

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/store"
)

// IndexCap bounds the output text indexed for search per command: the
// first 256 KiB after escapes are removed. Text beyond it is still
// recorded, replayed and downloadable; only search does not see it (its
// hits say so). It keeps every command's index entry within Postgres'
// tsvector limits and the index of a long-running noisy command from
// crowding out everything else.
const IndexCap = 256 << 10

// indexRawCap bounds how much recorded output indexing reads: output that
// is nearly all escapes (a colour test looping) yields little text, and
// the index is written inside the transaction that ends the command.
const indexRawCap = 64 << 20

// Bounds of the moments map of an index entry: a moment every 50 ms at
// most, and at most 64 KiB of them (a match after the last one links to
// the last one).
const (
	momentStep   = 50
	momentsLimit = 64 << 10
)

// textEntry is a command's search index entry.
type textEntry struct {
	CommandID int64 `gorm:"primaryKey"`
	Command   string
	Body      string
	// Times maps offsets in Body to moments of the recording:
	// "offset:ms offset:ms ...", ms counted from the command's start.
	Times  string
	Capped bool
}

func (textEntry) TableName() string { return "recording_text" }

// indexTx writes command c's search index entry inside tx (the transaction
// recording its end): its command line and its output with escapes
// removed, up to IndexCap. Writing it twice keeps the first. A recording
// that cannot be decoded is indexed as far as it can be read; verification
// reports the damage.
func indexTx(ctx context.Context, tx *gorm.DB, c Command) error {
	e := textEntry{CommandID: c.ID, Command: string(ValidUTF8([]byte(c.Command)))}
	var body []byte
	var times []byte
	var s Stripper
	lastMS := int64(-momentStep)
	raw := 0
	err := Walk(ctx, tx, c.ID, KindOut, func(ch Chunk) error {
		if ch.Stream == StreamGap {
			return nil
		}
		if raw += len(ch.Data); raw > indexRawCap {
			e.Capped = true
			return errStop
		}
		off := len(body)
		if ch.Stream == StreamExec {
			body = execText(body, ch.Data)
		} else {
			body = s.Append(body, ch.Data)
		}
		if ms := sinceStart(c, ch.At); len(body) > off && ms >= lastMS+momentStep && len(times) < momentsLimit {
			times = strconv.AppendInt(append(strconv.AppendInt(times, int64(off), 10), ':'), ms, 10)
			times = append(times, ' ')
			lastMS = ms
		}
		if len(body) > IndexCap {
			body, e.Capped = cutRunes(body, IndexCap), true
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errCorrupt) {
		return fmt.Errorf("index command %d: %w", c.ID, err)
	}
	e.Body, e.Times = string(ValidUTF8(body)), string(bytes.TrimSpace(times))
	if err := tx.WithContext(ctx).Clauses(clause.OnConflict{DoNothing: true}).Create(&e).Error; err != nil {
		return fmt.Errorf("index command %d: %w", c.ID, err)
	}
	return nil
}

// sinceStart is how far into command c's recording at is, in whole
// milliseconds rounded up (a replay started there shows the output of at).
func sinceStart(c Command, at time.Time) int64 {
	d := at.Sub(c.StartedAt)
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// IndexMissing indexes up to limit ended commands that have no search
// entry (they ended before search existed) and reports how many it did.
func IndexMissing(ctx context.Context, db *gorm.DB, limit int) (int, error) {
	var cs []Command
	err := db.WithContext(ctx).Where("state <> ? AND NOT EXISTS (SELECT 1 FROM recording_text r WHERE r.command_id = commands.id)", StateRunning).
		Order("id").Limit(limit).Find(&cs).Error
	if err != nil {
		return 0, fmt.Errorf("list unindexed commands: %w", err)
	}
	for _, c := range cs {
		if err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return indexTx(ctx, tx, c) }); err != nil {
			return 0, err
		}
	}
	return len(cs), nil
}

// Query selects recorded commands. Zero fields do not filter; set fields
// are combined with AND.
type Query struct {
	SessionID int64
	// Agent is an agent's id or exact name.
	Agent string
	// User is who ran the command: their id or exact name (a user's email,
	// an API key's name).
	User string
	// Exit is an exit code; NonZero asks for any other than 0.
	Exit    *int
	NonZero bool
	State   string
	// Since is the earliest start included; Until the first excluded.
	Since, Until time.Time
	// Text holds free-text terms (words or quoted phrases); each must
	// occur in the command line or its output (escapes removed).
	Text []string
}

// maxSearchQuery bounds a search box's text.
const maxSearchQuery = 1024

// maxTerms bounds the free-text terms of one search.
const maxTerms = 8

// ParseQuery reads the search box syntax, the audit log's:
//
//	session:12          commands of session 12
//	agent:coder         of an agent, by id or name
//	user:jane@acme.test run by a user (id or name) or API key (name)
//	exit:0, exit:nonzero
//	state:exited        running, exited, timed_out, killed or lost
//	since:2026-01-02    started from that day (UTC) or RFC 3339 instant
//	until:2026-01-31    through that whole day, or up to that instant
//	"disk full" panic   anything else: words and phrases, all required,
//	                    found in the command line or its output
//
// Problems are reported as an *apperr.ValidationError on the field "q".
func ParseQuery(q string) (Query, error) {
	var f Query
	if !utf8.ValidString(q) || strings.IndexByte(q, 0) >= 0 {
		return f, badQuery("The search holds a NUL byte or invalid UTF-8; remove it.")
	}
	if len(q) > maxSearchQuery {
		return f, badQuery("The search is longer than %d bytes; shorten it.", maxSearchQuery)
	}
	toks, ok := splitQuery(q)
	if !ok {
		return f, badQuery("A quote is not closed; add the closing \".")
	}
	seen := map[string]bool{}
	for _, t := range toks {
		if t.key == "" {
			if !strings.ContainsFunc(t.value, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }) {
				return Query{}, badQuery("%q holds no letter or digit; search for words.", t.value)
			}
			if len(f.Text) == maxTerms {
				return Query{}, badQuery("Give at most %d words or phrases.", maxTerms)
			}
			f.Text = append(f.Text, t.value)
			continue
		}
		if seen[t.key] {
			return Query{}, badQuery("The filter %s: is given twice; give it once.", t.key)
		}
		seen[t.key] = true
		if t.value == "" {
			return Query{}, badQuery("The filter %s: needs a value, like %s:%s.", t.key, t.key, queryExamples[t.key])
		}
		if err := f.set(t.key, t.value); err != nil {
			return Query{}, err
		}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return Query{}, badQuery("since: must be before until:.")
	}
	return f, nil
}

var queryExamples = map[string]string{"session": "12", "agent": "coder", "user": "jane@example.com", "exit": "0",
	"state": "exited", "since": "2026-01-02", "until": "2026-01-31"}

// set applies one key:value filter.
func (f *Query) set(key, v string) error {
	var err error
	switch key {
	case "session":
		if f.SessionID, err = strconv.ParseInt(v, 10, 64); err != nil || f.SessionID < 1 {
			return badQuery("session:%s is not a session number; use session:12.", v)
		}
	case "agent":
		f.Agent = v
	case "user":
		f.User = v
	case "exit":
		if strings.EqualFold(v, "nonzero") {
			f.NonZero = true
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < -1 || n > 255 {
			return badQuery("exit:%s is not an exit code; use exit:0, exit:1 or exit:nonzero.", v)
		}
		f.Exit = &n
	case "state":
		switch v = strings.ToLower(v); v {
		case StateRunning, StateExited, StateTimedOut, StateKilled, StateLost:
			f.State = v
		default:
			return badQuery("Unknown state %q; use running, exited, timed_out, killed or lost.", v)
		}
	case "since", "until":
		t, isDate, err := When(v)
		if err != nil {
			return badQuery("%s:%s is not a date; use 2026-01-02 or 2026-01-02T15:04:05Z.", key, v)
		}
		if key == "since" {
			f.Since = t
		} else {
			f.Until = UntilOf(t, isDate)
		}
	}
	return nil
}

// When reads a date (midnight UTC) or an RFC 3339 instant.
func When(s string) (t time.Time, isDate bool, err error) {
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t.UTC(), true, nil
	}
	t, err = time.Parse(time.RFC3339Nano, s)
	return t.UTC(), false, err
}

// UntilOf is the first moment excluded by an "until" of t: the next day
// for a date, just after the instant otherwise.
func UntilOf(t time.Time, isDate bool) time.Time {
	if isDate {
		return t.AddDate(0, 0, 1)
	}
	return t.Truncate(time.Microsecond).Add(time.Microsecond)
}

func badQuery(format string, args ...any) error {
	v := apperr.Validation()
	v.Add("q", format, args...)
	return v
}

type queryTerm struct {
	key   string // "" for free text
	value string
}

// splitQuery splits q into terms on spaces outside double quotes; a word
// key:value with a known key is a filter, anything else free text. It
// fails only on an unclosed quote.
func splitQuery(q string) ([]queryTerm, bool) {
	var out []queryTerm
	var word strings.Builder
	quoted, keyed := false, false
	flush := func() {
		w := word.String()
		word.Reset()
		if k, v, ok := strings.Cut(w, ":"); ok && keyed && queryExamples[k] != "" {
			out = append(out, queryTerm{key: k, value: v})
		} else if strings.TrimSpace(w) != "" {
			out = append(out, queryTerm{value: w})
		}
		keyed = false
	}
	for _, r := range q {
		switch {
		case r == '"':
			if !quoted && word.Len() == 0 {
				keyed = false
			} else if !quoted {
				// key:"value": the key is outside the quotes.
				keyed = strings.Contains(word.String(), ":")
			}
			quoted = !quoted
		case unicode.IsSpace(r) && !quoted:
			if word.Len() > 0 {
				flush()
			}
		default:
			if word.Len() == 0 && !quoted {
				keyed = true
			}
			word.WriteRune(r)
		}
	}
	if quoted {
		return nil, false
	}
	if word.Len() > 0 {
		flush()
	}
	return out, true
}

// Hit is one command a search found.
type Hit struct {
	Command   Command
	AgentID   int64
	AgentName string
	// At is how many seconds into the recording the first free-text term
	// occurs in the output (0 without one, or when it matched the command
	// line only).
	At float64
	// Snippet is the line of output around that moment.
	Snippet string
	// Capped says the output was longer than the search sees (IndexCap).
	Capped bool
}

type hitRow struct {
	Command
	AgentID   int64
	AgentName string
}

// Default and maximum search page sizes.
const (
	DefaultSearchPage = 50
	MaxSearchPage     = 200
)

// Search returns the commands matching q with an id below before (0: from
// the newest), newest first, at most limit. Free text is looked up in the
// database's own full-text index: FTS5 on SQLite, a GIN-indexed tsvector
// on Postgres; both tokenize words without stemming.
func Search(ctx context.Context, db *gorm.DB, q Query, before int64, limit int) ([]Hit, error) {
	if limit <= 0 {
		limit = DefaultSearchPage
	}
	limit = min(limit, MaxSearchPage)
	var rows []hitRow
	var err error
	if len(q.Text) > 0 && store.DialectOfDB(db) == store.Postgres {
		rows, err = pgTextSearch(ctx, db, q, before, limit)
	} else {
		tx := filtered(ctx, db, q, before)
		if len(q.Text) > 0 {
			tx = tx.Where("c.id IN (SELECT rowid FROM recording_fts WHERE recording_fts MATCH ?)", ftsQuery(q.Text))
		}
		err = tx.Order("c.id DESC").Limit(limit).Scan(&rows).Error
	}
	if err != nil {
		return nil, fmt.Errorf("search recordings: %w", err)
	}
	hits := make([]Hit, len(rows))
	for i, r := range rows {
		hits[i] = Hit{Command: r.Command, AgentID: r.AgentID, AgentName: r.AgentName}
	}
	if len(q.Text) == 0 || len(hits) == 0 {
		return hits, nil
	}
	return hits, locate(ctx, db, hits, q.Text)
}

// filtered selects the commands matching q's filters but its free text,
// with their agents, below before.
func filtered(ctx context.Context, db *gorm.DB, q Query, before int64) *gorm.DB {
	tx := db.WithContext(ctx).Table("commands c").
		Select("c.*, a.id AS agent_id, a.name AS agent_name").
		Joins("JOIN sessions s ON s.id = c.session_id").
		Joins("JOIN agents a ON a.id = s.agent_id")
	if before > 0 {
		tx = tx.Where("c.id < ?", before)
	}
	if q.SessionID > 0 {
		tx = tx.Where("c.session_id = ?", q.SessionID)
	}
	if q.Agent != "" {
		if id, err := strconv.ParseInt(q.Agent, 10, 64); err == nil {
			tx = tx.Where("(a.id = ? OR a.name = ?)", id, q.Agent)
		} else {
			tx = tx.Where("a.name = ?", q.Agent)
		}
	}
	if q.User != "" {
		tx = tx.Where("(c.actor_id = ? OR c.actor_name = ?)", q.User, q.User)
	}
	if q.Exit != nil {
		tx = tx.Where("c.exit_code = ?", *q.Exit)
	}
	if q.NonZero {
		tx = tx.Where("c.exit_code <> 0")
	}
	if q.State != "" {
		tx = tx.Where("c.state = ?", q.State)
	}
	if !q.Since.IsZero() {
		tx = tx.Where("c.started_at >= ?", q.Since.UTC())
	}
	if !q.Until.IsZero() {
		tx = tx.Where("c.started_at < ?", q.Until.UTC())
	}
	return tx
}

// First and largest candidate batches of a Postgres text search.
const (
	firstCandidates = 500
	maxCandidates   = 8000
)

// pgTextSearch finds q's commands in two steps. First the GIN index alone
// names candidates, newest first: every term's words must occur
// (plainto_tsquery, which the index answers without reading a tsvector).
// The planner is kept from its other choice, walking commands newest first
// and reading each one's tsvector until enough match: for a rare word that
// reads every tsvector in the org (seconds at 100,000 commands). Then the
// candidates are checked against the filters and, for terms of several
// words, the exact phrase, reading only their tsvectors. Batches grow
// until the page is full or the candidates run out.
func pgTextSearch(ctx context.Context, db *gorm.DB, q Query, before int64, limit int) ([]hitRow, error) {
	var out []hitRow
	phrases := multiWord(q.Text)
	first := firstCandidates
	if len(phrases) > 0 {
		// Each candidate costs a tsvector read: few at first, as most
		// commands holding a phrase's words hold the phrase.
		first = 2 * limit
	}
	for batch := first; ; batch = min(batch*4, maxCandidates) {
		var ids []int64
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("SET LOCAL enable_seqscan = off").Error; err != nil {
				return err
			}
			if err := tx.Exec("SET LOCAL enable_indexscan = off").Error; err != nil {
				return err
			}
			s := tx.Table("recording_text").Select("command_id")
			for _, t := range q.Text {
				s = s.Where("search @@ plainto_tsquery('simple', ?)", t)
			}
			if before > 0 {
				s = s.Where("command_id < ?", before)
			}
			return s.Order("command_id DESC").Limit(batch).Pluck("command_id", &ids).Error
		})
		if err != nil || len(ids) == 0 {
			return out, err
		}
		tx := filtered(ctx, db, q, 0).Where("c.id IN ?", ids)
		if len(phrases) > 0 {
			tx = tx.Joins("JOIN recording_text r ON r.command_id = c.id")
			for _, t := range phrases {
				tx = tx.Where("r.search @@ phraseto_tsquery('simple', ?)", t)
			}
		}
		var rows []hitRow
		if err := tx.Order("c.id DESC").Limit(limit - len(out)).Scan(&rows).Error; err != nil {
			return out, err
		}
		out = append(out, rows...)
		if len(out) >= limit || len(ids) < batch {
			return out, nil
		}
		before = ids[len(ids)-1]
	}
}

// multiWord lists the terms that are more than one word: their order
// matters, which only a phrase query over the tsvector checks.
func multiWord(terms []string) []string {
	var out []string
	for _, t := range terms {
		if strings.ContainsFunc(t, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
			out = append(out, t)
		}
	}
	return out
}

// ftsQuery is an FTS5 query requiring each term as a phrase.
func ftsQuery(terms []string) string {
	parts := make([]string, len(terms))
	for i, t := range terms {
		parts[i] = `"` + strings.ReplaceAll(t, `"`, `""`) + `"`
	}
	return strings.Join(parts, " ")
}

// locate finds, for each hit, the first moment of its output where one of
// terms occurs, and the line around it.
func locate(ctx context.Context, db *gorm.DB, hits []Hit, terms []string) error {
	ids := make([]int64, len(hits))
	for i, h := range hits {
		ids[i] = h.Command.ID
	}
	var es []textEntry
	if err := db.WithContext(ctx).Where("command_id IN ?", ids).Find(&es).Error; err != nil {
		return fmt.Errorf("read search entries: %w", err)
	}
	byID := make(map[int64]textEntry, len(es))
	for _, e := range es {
		byID[e.CommandID] = e
	}
	lower := make([]string, len(terms))
	for i, t := range terms {
		lower[i] = asciiLower(t)
	}
	for i := range hits {
		e := byID[hits[i].Command.ID]
		hits[i].Capped = e.Capped
		body := asciiLower(e.Body)
		at := -1
		for _, t := range lower {
			if j := strings.Index(body, t); j >= 0 && (at < 0 || j < at) {
				at = j
			}
		}
		if at < 0 {
			continue
		}
		hits[i].At = float64(momentAt(e.Times, at)) / 1000
		hits[i].Snippet = lineAround(e.Body, at, 160)
	}
	return nil
}

// asciiLower lowers ASCII letters only, keeping every offset of s (the
// moments map is by offset).
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// momentAt reads the moment (ms) of offset off from an entry's map.
func momentAt(times string, off int) int64 {
	ms := int64(0)
	for _, p := range strings.Fields(times) {
		o, m, ok := strings.Cut(p, ":")
		if !ok {
			continue
		}
		oi, err1 := strconv.Atoi(o)
		mi, err2 := strconv.ParseInt(m, 10, 64)
		if err1 != nil || err2 != nil || oi > off {
			break
		}
		ms = mi
	}
	return ms
}

// lineAround is the line of s holding offset at, at most n bytes of it
// (centred on at when longer).
func lineAround(s string, at, n int) string {
	start := strings.LastIndexByte(s[:at], '\n') + 1
	end := len(s)
	if j := strings.IndexByte(s[at:], '\n'); j >= 0 {
		end = at + j
	}
	if end-start > n {
		start = max(start, at-n/2)
		end = min(end, start+n)
		for start < end && !utf8.RuneStart(s[start]) {
			start++
		}
		for end > start && end < len(s) && !utf8.RuneStart(s[end]) {
			end--
		}
	}
	return strings.TrimSpace(s[start:end])
}
