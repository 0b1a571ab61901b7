package chaos

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sandbox"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2b"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
)

// settleWithin bounds the wait for every command to end once the chaos
// stopped.
const settleWithin = 2 * time.Minute

// settle waits until every replica answers and no command is running in
// any org.
func (r *chaosRun) settle(ctx context.Context) error {
	deadline := time.Now().Add(settleWithin)
	for _, rp := range r.replicas {
		for !rp.ready(ctx, r.probeHC) {
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("console %d is not ready %s after the chaos stopped", rp.idx, settleWithin)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, o := range r.orgs {
		db, err := r.orgDB(ctx, o)
		if err != nil {
			return err
		}
		for {
			var running []string
			// An exec answered 503 yet recorded is never acknowledged by
			// agentd and ends lost only after two minutes: not waited for.
			if err := db.WithContext(ctx).Raw("SELECT id || ' ' || command FROM commands WHERE state = 'running' AND NOT (agentd_acked = false AND id IN ?) ORDER BY id",
				append(r.unknownCommits(o), -1)).Scan(&running).Error; err != nil {
				return fmt.Errorf("org %s: read running commands: %w", o.slug, err)
			}
			if len(running) == 0 {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("org %s: %d commands still running %s after the chaos stopped: %s", o.slug, len(running), settleWithin,
					strings.Join(running[:min(5, len(running))], "; "))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// unknownCommits are the ids of o's commands whose exec was answered 503
// and which were recorded all the same.
func (r *chaosRun) unknownCommits(o *chaosOrg) []int64 {
	var ids []int64
	for _, c := range r.commands {
		if c.s.org == o && c.unknownCommit {
			ids = append(ids, c.id)
		}
	}
	return ids
}

// orgDB opens an org's database directly (not through a replica), for the
// invariants the API does not show.
func (r *chaosRun) orgDB(ctx context.Context, o *chaosOrg) (*gorm.DB, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.orgDBs == nil {
		r.orgDBs = map[string]*gorm.DB{}
	}
	if db, ok := r.orgDBs[o.slug]; ok {
		return db, nil
	}
	dsn, err := store.WithDatabase(r.o.PostgresDSN, r.prefix+strings.ReplaceAll(o.slug, "-", "_"))
	if err != nil {
		return nil, err
	}
	db, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 2})
	if err != nil {
		return nil, fmt.Errorf("open org %s's database: %w", o.slug, err)
	}
	r.orgDBs[o.slug] = db
	return db, nil
}

// check verifies every invariant and returns how many checks of each it
// made; violations go to the run.
func (r *chaosRun) check(ctx context.Context) map[string]int {
	checks := map[string]int{}
	for _, c := range r.commands {
		r.checkRecording(ctx, c, checks)
	}
	for _, o := range r.orgs {
		r.checkOrg(ctx, o, checks)
	}
	r.checkSandboxes(ctx, checks)
	return checks
}

// recordingJSON is the recording download's JSON form.
type recordingJSON struct {
	Command struct {
		ID    int64  `json:"id"`
		State string `json:"state"`
	} `json:"command"`
	Events []struct {
		Seq    uint64 `json:"seq"`
		Stream string `json:"stream"`
		Data   []byte `json:"data"`
	} `json:"events"`
}

// checkRecording compares a command's recording with what its command
// printed and its client read: every chunk exactly once.
func (r *chaosRun) checkRecording(ctx context.Context, c *cmdRecord, checks map[string]int) {
	s := c.s
	var rec recordingJSON
	if _, err := r.c.do(ctx, request{method: http.MethodGet, path: s.path("/commands/%d/recording?format=json", c.id), token: s.org.key,
		org: s.org.slug, env: s.env, retryOn: []int{http.StatusServiceUnavailable}}, &rec); err != nil {
		r.violate("command %d (%s): read its recording: %v", c.id, c.tag, err)
		return
	}
	name := fmt.Sprintf("command %d (%s, %s in session %d on %s)", c.id, c.tag, c.kind, s.id, s.env)
	if c.unknownCommit {
		// Never sent to agentd: nothing recorded; running until agentd's
		// two minutes to acknowledge it are over, then lost.
		// What was typed into it before the driver gave up is recorded
		// (durable before forwarded) even though agentd never took it:
		// input, never output.
		checks["a command never started records no output"]++
		output := 0
		for _, ev := range rec.Events {
			if ev.Stream != recordings.StreamStdin && ev.Stream != recordings.StreamTypist && ev.Stream != recordings.StreamEOF {
				output++
			}
		}
		if output != 0 || rec.Command.State != "running" && rec.Command.State != "lost" {
			r.violate("%s, never started (503 at its exec, or its replica died before agentd heard of it): %d output chunks recorded, state %s",
				name, output, rec.Command.State)
		}
		return
	}
	checks["recording: chunk ids rising, none twice"]++
	var out strings.Builder
	var last uint64
	for _, ev := range rec.Events {
		if ev.Stream == "typist" {
			continue // the input chain's: who types from here on
		}
		if ev.Seq <= last {
			r.violate("%s: the recording holds chunk %d after chunk %d", name, ev.Seq, last)
		}
		last = ev.Seq
		if ev.Stream == "stdout" {
			out.Write(ev.Data)
		}
	}
	recorded := out.String()
	state := rec.Command.State
	// The follower may record a command's end well after its client read
	// it: a restart any time after the start may have lost it.
	lostToRestart := state == "lost" && r.restartedDuring(s.env, c.started, time.Now())
	checks["recording: state as the client saw it"]++
	switch {
	case state == c.state && state == "exited":
	case lostToRestart && (c.state == "lost" || c.state == "exited"):
		// agentd forgot the command in its restart. The client may have
		// read its end from agentd before that while the follower still
		// lagged behind (its replica was killed): the recording then
		// stops short, and must be a clean prefix of what was printed.
		checks["lost only to the agentd restart"]++
		if c.state == "exited" {
			r.count(r.ops, "ended on agentd, recorded lost with a cut tail (agentd restarted before the follower caught up)")
		}
	case state == "lost":
		r.violate("%s ended lost without an agentd restart under it (the client saw %q)", name, c.state)
	default:
		r.violate("%s: the client saw it end %q, the record says %q", name, c.state, state)
	}
	complete := state == "exited"
	if complete {
		checks["recording: equals what the client read"]++
		if recorded != c.client {
			r.violate("%s: the recording (%d bytes) is not what the client read (%d bytes)", name, len(recorded), len(c.client))
		}
		if c.watched {
			checks["recording: equals what a second reader read"]++
			if recorded != c.watcher {
				r.violate("%s: the recording (%d bytes) is not what the second reader read (%d bytes)", name, len(recorded), len(c.watcher))
			}
		}
	} else if !strings.HasPrefix(c.client, recorded) {
		r.violate("%s: the recording of the lost command is not a prefix of what the client read", name)
	}
	switch c.kind {
	case "counter":
		checks["recording: every counter line exactly once"]++
		if msg := counterLines(recorded, c.n, complete); msg != "" {
			r.violate("%s: the recording %s", name, msg)
		}
		if msg := counterLines(c.client, c.n, c.state == "exited"); msg != "" {
			r.violate("%s: what the client read %s", name, msg)
		}
	case "interactive":
		checks["recording: every typed line answered exactly once"]++
		// The process reads each line once, whatever the recording of
		// input holds.
		if msg := typedLines(recorded, "got "+c.tag, c.n, c.ambiguous, nil, complete); msg != "" {
			r.violate("%s: the recording %s", name, msg)
		}
		r.checkInput(ctx, c, name, checks)
	case "probe":
		if c.state == "exited" && recorded != c.tag+"\n" {
			r.violate("%s: recorded %q", name, recorded)
		}
	}
}

// checkInput reads the command's stdin chain from the database: every
// line typed with an answer is recorded exactly once, a line whose write
// got no answer at most once.
func (r *chaosRun) checkInput(ctx context.Context, c *cmdRecord, name string, checks map[string]int) {
	db, err := r.orgDB(ctx, c.s.org)
	if err != nil {
		r.violate("%v", err)
		return
	}
	var in strings.Builder
	var last uint64
	if err := recordings.Walk(ctx, db, c.id, recordings.KindIn, func(ch recordings.Chunk) error {
		if ch.Seq <= last {
			r.violate("%s: the input recording holds chunk %d after %d", name, ch.Seq, last)
		}
		last = ch.Seq
		if ch.Stream != recordings.StreamTypist { // who typed, not what
			in.Write(ch.Data)
		}
		return nil
	}); err != nil {
		r.violate("%s: read its input recording: %v", name, err)
		return
	}
	checks["input recording: every typed line exactly once"]++
	if msg := typedLines(in.String(), c.tag, c.n, c.ambiguous, c.twice, true); msg != "" {
		r.violate("%s: the input recording %s (ambiguous writes %v; its error answers: %s)", name, msg, c.ambiguous, r.answersFor(c))
	}
}

// answersFor lists the error answers the driver got about c.
func (r *chaosRun) answersFor(c *cmdRecord) string {
	var out []string
	needle := fmt.Sprintf("/commands/%d", c.id)
	for _, a := range r.c.answers() {
		if strings.Contains(a.Path, needle) {
			out = append(out, a.describe(r.t0))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "; ")
}

// counterLines checks out is 1..n (complete) or 1..k for some k ≤ n,
// each line once, in order.
func counterLines(out string, n int, complete bool) string {
	lines := splitLines(out)
	for i, l := range lines {
		if l != strconv.Itoa(i+1) {
			return fmt.Sprintf("is not the counter's lines once each in order: line %d is %q (%d lines)", i+1, l, len(lines))
		}
	}
	if len(lines) > n || complete && len(lines) != n {
		return fmt.Sprintf("has %d counter lines, want %d", len(lines), n)
	}
	return ""
}

// typedLines checks out holds prefix-k lines with rising k ≤ n: a line
// in twice at most twice (in a row), any other at most once; when
// complete, every k not in ambiguous at least once.
func typedLines(out, prefix string, n int, ambiguous, twice map[int]bool, complete bool) string {
	seen := map[int]int{}
	prev := 0
	for _, l := range splitLines(out) {
		rest, ok := strings.CutPrefix(l, prefix+"-")
		k, err := strconv.Atoi(rest)
		if !ok || err != nil || k < 1 || k > n {
			return fmt.Sprintf("holds a line that was not typed: %q", l)
		}
		if k < prev || k == prev && (!twice[k] || seen[k] == 2) {
			return fmt.Sprintf("holds line %d after line %d (twice or out of order)", k, prev)
		}
		prev = k
		seen[k]++
	}
	if complete {
		for k := 1; k <= n; k++ {
			if seen[k] == 0 && !ambiguous[k] {
				return fmt.Sprintf("lacks typed line %d", k)
			}
		}
	}
	return ""
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// restartedDuring reports whether env's agentd restarted while a command
// that ran from start to end could have been on it.
func (r *chaosRun) restartedDuring(env string, start, end time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.windows {
		if w.kind == "agentd_restart" && w.target == env && !w.start.After(end) && (w.end.IsZero() || !w.end.Before(start.Add(-time.Second))) {
			return true
		}
	}
	return false
}

// checkOrg checks an org's audit log (through the API and row by row),
// its sessions and its follower leases.
func (r *chaosRun) checkOrg(ctx context.Context, o *chaosOrg, checks map[string]int) {
	var res struct {
		OK      bool   `json:"ok"`
		Checked int64  `json:"checked"`
		Reason  string `json:"reason"`
	}
	checks["audit verify (API) passes"]++
	if _, err := r.c.do(ctx, request{method: http.MethodPost, path: "/api/v1/orgs/" + o.slug + "/audit/verify", token: o.root, org: o.slug,
		retryOn: []int{http.StatusServiceUnavailable}}, &res); err != nil {
		r.violate("org %s: audit verify: %v", o.slug, err)
	} else if !res.OK {
		r.violate("org %s: audit verify failed after %d events: %s", o.slug, res.Checked, res.Reason)
	}
	db, err := r.orgDB(ctx, o)
	if err != nil {
		r.violate("%v", err)
		return
	}
	type cmdRow struct {
		ID          int64
		State       string
		LeaseOwner  string
		LeaseUntil  *time.Time
		AgentdAcked bool
		Execs       int
		Ends        int
	}
	unknown := map[int64]bool{}
	for _, id := range r.unknownCommits(o) {
		unknown[id] = true
	}
	var rows []cmdRow
	if err := db.WithContext(ctx).Raw(`SELECT c.id, c.state, c.lease_owner, c.lease_until, c.agentd_acked,
		(SELECT count(*) FROM audit_events a WHERE a.target_type = 'command' AND a.target_id = CAST(c.id AS TEXT) AND a.action = 'command.exec') AS execs,
		(SELECT count(*) FROM audit_events a WHERE a.target_type = 'command' AND a.target_id = CAST(c.id AS TEXT) AND a.action = 'command.end') AS ends
		FROM commands c ORDER BY c.id`).Scan(&rows).Error; err != nil {
		r.violate("org %s: read commands: %v", o.slug, err)
		return
	}
	known := map[int64]bool{}
	for _, row := range rows {
		known[row.ID] = true
		if unknown[row.ID] && row.State == "running" {
			// Still waiting out agentd's two minutes: its lease must be
			// held by a live follower (renewed within the lease).
			checks["a lease on a running command is renewed"]++
			if row.Execs != 1 || row.Ends != 0 || row.AgentdAcked || row.LeaseUntil == nil || row.LeaseUntil.Before(time.Now().Add(-2*chaosLease)) {
				r.violate("org %s: command %d (exec answered 503, recorded): %d exec and %d end events, acked %v, lease until %v",
					o.slug, row.ID, row.Execs, row.Ends, row.AgentdAcked, row.LeaseUntil)
			}
			continue
		}
		checks["audit: command.exec and command.end once each"]++
		if row.Execs != 1 || row.Ends != 1 {
			r.violate("org %s: command %d has %d command.exec and %d command.end events, want one each", o.slug, row.ID, row.Execs, row.Ends)
		}
		checks["no lease left on an ended command"]++
		if row.State == "running" || row.LeaseOwner != "" {
			r.violate("org %s: command %d is %s with lease owner %q after the run settled", o.slug, row.ID, row.State, row.LeaseOwner)
		}
	}
	for _, c := range r.commands {
		if c.s.org == o {
			checks["every command the driver started is recorded"]++
			if !known[c.id] {
				r.violate("org %s: command %d (%s) the driver started has no record", o.slug, c.id, c.tag)
			}
		}
	}
	// The driver does only what its member may do: a denial is a wrong
	// decision (a replica's stale or mixed-up view of the org).
	var denials []struct {
		Seq        int64
		ActorName  string
		TargetType string
		TargetID   string
		Details    string
	}
	if err := db.WithContext(ctx).Raw("SELECT seq, actor_name, target_type, target_id, details FROM audit_events WHERE action = 'authz.deny' ORDER BY seq").
		Scan(&denials).Error; err != nil {
		r.violate("org %s: read denials: %v", o.slug, err)
	}
	checks["no denial of what the member may do"]++
	for _, d := range denials {
		r.violate("org %s: audit event %d denied %s %s/%s: %s", o.slug, d.Seq, d.ActorName, d.TargetType, d.TargetID, d.Details)
	}
	var sess []struct {
		ID               int64
		State            string
		UnreachableSince *time.Time
		ClosingAt        *time.Time
	}
	if err := db.WithContext(ctx).Raw("SELECT id, state, unreachable_since, closing_at FROM sessions ORDER BY id").Scan(&sess).Error; err != nil {
		r.violate("org %s: read sessions: %v", o.slug, err)
		return
	}
	for _, s := range sess {
		checks["no session stuck or lost"]++
		if s.State != sessions.StateRunning || s.ClosingAt != nil {
			r.violate("org %s: session %d is %s (closing since %v) after the run; every session should be running", o.slug, s.ID, s.State, s.ClosingAt)
		}
	}
}

// checkSandboxes asks the E2B fake for the run's sandboxes: exactly one
// live sandbox per sandbox session, none for any other.
func (r *chaosRun) checkSandboxes(ctx context.Context, checks map[string]int) {
	cl, err := e2b.New(r.fake.URL(), chaosAPIKey, nil)
	if err != nil {
		r.violate("E2B client: %v", err)
		return
	}
	list, err := cl.List(ctx, sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning, sandbox.StatePaused}})
	if err != nil {
		r.violate("list the fake's sandboxes: %v", err)
		return
	}
	per := map[string][]string{}
	for _, sb := range list {
		k := sb.Metadata[sessions.MetaOrg] + "/" + sb.Metadata[sessions.MetaSession]
		per[k] = append(per[k], sb.ID)
	}
	for _, s := range r.sessions {
		k := s.org.slug + "/" + strconv.FormatInt(s.id, 10)
		ids := per[k]
		delete(per, k)
		checks["exactly one sandbox per sandbox session"]++
		want := 0
		if s.env == "sandbox" && s.seq > 0 {
			want = 1
		}
		if len(ids) != want {
			r.violate("session %d of %s (%s): %d live sandboxes at the backend %v, want %d", s.id, s.org.slug, s.env, len(ids), ids, want)
		}
	}
	for k, ids := range per {
		r.violate("sandboxes %v at the backend belong to no session of the run (%s)", ids, k)
	}
}
