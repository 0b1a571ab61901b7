package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The E2B fake's credentials for the chaos run's sandbox environment.
const (
	chaosAPIKey        = "e2b_chaos_key"
	chaosTemplateToken = "chaos-template-agentd-token"
)

// chaosOrg is one org of the run, with its admin's and member's
// credentials and its environments.
type chaosOrg struct {
	slug   string
	root   string // the platform admin's token inside the org
	key    string // the member's API key
	agents map[string]int64
}

// chaosSession is one of the sessions the driver keeps busy.
type chaosSession struct {
	idx int
	org *chaosOrg
	env string
	id  int64
	seq int
	mu  sync.Mutex // one prober at a time may borrow the session

	// doing says what the session's driver is doing now, for a run that
	// finds it stuck (see stuckDrivers).
	doing atomic.Pointer[activity]
}

// activity is what a session's driver is doing: what, on which command,
// since when.
type activity struct {
	what    string
	command int64
	since   time.Time
}

// set records what the driver does now.
func (s *chaosSession) set(command int64, format string, args ...any) {
	s.doing.Store(&activity{what: fmt.Sprintf(format, args...), command: command, since: time.Now()})
}

func (s *chaosSession) path(format string, args ...any) string {
	return fmt.Sprintf("/api/v1/orgs/%s/sessions/%d", s.org.slug, s.id) + fmt.Sprintf(format, args...)
}

// cmdRecord is what the driver knows of one command it started.
type cmdRecord struct {
	s       *chaosSession
	id      int64
	kind    string // counter, interactive, file, probe
	tag     string
	command string
	n       int // counter: lines printed; interactive: lines typed
	// ambiguous marks typed lines whose stdin write got no answer (they
	// may have arrived once); twice marks lines whose write was answered
	// 503 and sent again (recorded at most twice, typed once).
	ambiguous, twice map[int]bool
	// unknownCommit marks an exec answered 503 that was recorded all the
	// same (the database went away while its commit was answered): it
	// never reaches agentd and ends lost once agentd has not acknowledged
	// it for two minutes.
	unknownCommit bool
	// eofRefused: the last EOF was answered 502 (not sent again), and
	// eofUnstarted: because agentd has not started the command yet.
	eofRefused, eofUnstarted bool
	// eofPending: the EOF still has to reach agentd (follow sends it).
	eofPending bool
	client     string // stdout as the client read it through the gateway
	watcher    string // stdout as a second reader read it (counter), or ""
	watched    bool
	state      string
	started    time.Time
	ended      time.Time
}

// setup creates, through the balancer: two orgs, each with a department, a
// member with an API key, two host environments (the run's agentd hosts),
// a sandbox environment on the E2B fake with a template, one agent per
// environment, and the sessions spread over them.
func (r *chaosRun) setup(ctx context.Context) error {
	var login struct{ Token string }
	if _, err := r.c.do(ctx, request{method: http.MethodPost, path: "/api/v1/auth/login",
		body: map[string]string{"email": chaosAdmin, "password": chaosPasswd}}, &login); err != nil {
		return err
	}
	r.platform = login.Token
	for _, slug := range []string{"acme", "globex"} {
		o := &chaosOrg{slug: slug, agents: map[string]int64{}}
		if err := r.setupOrg(ctx, o); err != nil {
			return fmt.Errorf("org %s: %w", slug, err)
		}
		r.orgs = append(r.orgs, o)
	}
	envs := []string{"host-a", "host-b", "sandbox"}
	for i := range r.o.Sessions {
		o := r.orgs[0]
		if i%5 == 4 {
			o = r.orgs[1]
		}
		s := &chaosSession{idx: i, org: o, env: envs[i%3]}
		var sess struct{ ID int64 }
		if _, err := r.c.do(ctx, request{method: http.MethodPost, path: "/api/v1/orgs/" + o.slug + "/sessions", token: o.key,
			body: map[string]any{"agent_id": o.agents[s.env]}}, &sess); err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		s.id = sess.ID
		r.sessions = append(r.sessions, s)
	}
	return nil
}

func (r *chaosRun) setupOrg(ctx context.Context, o *chaosOrg) error {
	call := func(method, path, token string, in, out any) error {
		_, err := r.c.do(ctx, request{method: method, path: path, token: token, body: in}, out)
		return err
	}
	base := "/api/v1/orgs/" + o.slug
	if err := call(http.MethodPost, "/api/v1/orgs", r.platform, map[string]string{"slug": o.slug, "name": strings.ToUpper(o.slug[:1]) + o.slug[1:]}, nil); err != nil {
		return err
	}
	var entered struct{ Token string }
	if err := call(http.MethodPost, base+"/enter", r.platform, nil, &entered); err != nil {
		return err
	}
	o.root = entered.Token
	var dept struct{ ID int64 }
	if err := call(http.MethodPost, base+"/departments", o.root, map[string]string{"name": "Chaos"}, &dept); err != nil {
		return err
	}
	var user struct {
		User            struct{ ID int64 }
		OneTimePassword string `json:"one_time_password"`
	}
	email := "member@" + o.slug + ".test"
	if err := call(http.MethodPost, base+"/users", o.root, map[string]string{"email": email, "name": "Chaos member"}, &user); err != nil {
		return err
	}
	if err := call(http.MethodPost, base+"/roles", o.root, map[string]string{"subject": fmt.Sprintf("user:%d", user.User.ID), "role": "member",
		"domain": fmt.Sprintf("dept:%d", dept.ID)}, nil); err != nil {
		return err
	}
	var ml struct{ Token string }
	if err := call(http.MethodPost, base+"/auth/login", "", map[string]string{"email": email, "password": user.OneTimePassword}, &ml); err != nil {
		return err
	}
	if err := call(http.MethodPost, base+"/auth/password", ml.Token, map[string]string{"current_password": user.OneTimePassword,
		"new_password": "a-long-chaos-member-password"}, nil); err != nil {
		return err
	}
	var key struct{ Secret string }
	if err := call(http.MethodPost, base+"/api-keys", ml.Token, map[string]string{"name": "chaos runtime"}, &key); err != nil {
		return err
	}
	o.key = key.Secret
	for _, name := range []string{"host-a", "host-b"} {
		var env, agent struct{ ID int64 }
		if err := call(http.MethodPost, base+"/environments", o.root, map[string]any{"name": name, "kind": "host", "department_id": dept.ID,
			"url": r.hosts[name].URL(), "os": "linux", "deployment": "bare-metal", "agentd_token": r.hosts[name].launcher.Token}, &env); err != nil {
			return err
		}
		if err := call(http.MethodPost, base+"/agents", o.root, map[string]any{"name": "agent-" + name, "department_id": dept.ID,
			"config": map[string]string{"model": "m"}, "environment_ids": []int64{env.ID}}, &agent); err != nil {
			return err
		}
		o.agents[name] = agent.ID
	}
	var env, tpl, agent struct{ ID int64 }
	if err := call(http.MethodPost, base+"/environments", o.root, map[string]any{"name": "sandboxes", "kind": "sandbox", "department_id": dept.ID,
		"url": r.fake.URL(), "proxy_base_url": r.fake.ProxyURL(), "sandbox_scheme": "http", "api_key": chaosAPIKey,
		"agentd_token": chaosTemplateToken}, &env); err != nil {
		return err
	}
	if err := call(http.MethodPost, fmt.Sprintf("%s/environments/%d/templates", base, env.ID), o.root,
		map[string]any{"import": true, "backend_template_id": "base"}, &tpl); err != nil {
		return err
	}
	if err := call(http.MethodPost, base+"/agents", o.root, map[string]any{"name": "agent-sandbox", "department_id": dept.ID,
		"config": map[string]string{"model": "m"}, "sandbox_mode": "per-session", "template_id": tpl.ID,
		"environment_ids": []int64{env.ID}}, &agent); err != nil {
		return err
	}
	o.agents["sandbox"] = agent.ID
	return nil
}

// work keeps one session busy until stopAt: counters followed by one or
// two readers, interactive commands fed through stdin, and files written
// and read back.
func (r *chaosRun) work(ctx context.Context, s *chaosSession, stopAt time.Time) {
	failures := 0
	for time.Now().Before(stopAt) && ctx.Err() == nil {
		var err error
		s.set(0, "choosing its next operation")
		switch p := rand.IntN(100); {
		case p < 55:
			err = r.counterOp(ctx, s)
		case p < 80:
			err = r.interactiveOp(ctx, s)
		default:
			err = r.fileOp(ctx, s)
		}
		if err != nil && ctx.Err() == nil {
			r.violate("session %d (%s, %s): %v", s.id, s.org.slug, s.env, err)
			if failures++; failures == 3 {
				// A broken session would only repeat the same failure.
				return
			}
		}
	}
}

func (r *chaosRun) newCommand(s *chaosSession, kind string) *cmdRecord {
	s.mu.Lock()
	s.seq++
	tag := fmt.Sprintf("chaos-%s-s%d-%d", kind, s.idx, s.seq)
	s.mu.Unlock()
	return &cmdRecord{s: s, kind: kind, tag: tag, started: time.Now()}
}

func (r *chaosRun) keep(c *cmdRecord) {
	r.mu.Lock()
	r.commands = append(r.commands, c)
	r.mu.Unlock()
}

// execOutput is the part of an exec or output answer the driver reads.
type execOutput struct {
	CommandID  int64  `json:"command_id"`
	State      string `json:"state"`
	NextCursor uint64 `json:"next_cursor"`
	More       bool   `json:"more"`
	Chunks     []struct {
		ID     uint64 `json:"id"`
		Stream string `json:"stream"`
		Data   []byte `json:"data"`
	} `json:"chunks"`
}

var mayStartRE = regexp.MustCompile(`Command (\d+) is recorded and may still start`)

// exec starts c.command and sets c.id. An exec that got no answer (its
// replica was killed) may have been recorded: the driver looks for its
// tag in the session's history before sending it again, so nothing runs
// twice. A 502 names the recorded command, which may still start.
func (r *chaosRun) exec(ctx context.Context, c *cmdRecord, extra map[string]any) error {
	s := c.s
	body := map[string]any{"command": c.command}
	for k, v := range extra {
		body[k] = v
	}
	for {
		s.set(0, "starting %s", c.tag)
		var o execOutput
		_, err := r.c.do(ctx, request{method: http.MethodPost, path: s.path("/commands"), token: s.org.key, body: body, org: s.org.slug, env: s.env,
			once: true, retrySuspended: true, accept: []string{"environment_unreachable", "database_unavailable", "audit_unavailable"}}, &o)
		switch {
		case err == nil:
			c.id = o.CommandID
			return nil
		case isCode(err, "database_unavailable") || isCode(err, "audit_unavailable"):
			// Nothing was sent to agentd, but the record may have been
			// committed as the connection broke: look before sending again.
			var ae *apiError
			errors.As(err, &ae)
			r.c.record(request{method: http.MethodPost, path: s.path("/commands"), org: s.org.slug, env: s.env}, ae.Status, ae.Code, []byte(ae.Body))
			time.Sleep(300 * time.Millisecond)
			id, found, err := r.findByTag(ctx, c)
			if err != nil {
				return err
			}
			if found {
				c.id, c.unknownCommit = id, true
				r.count(r.ops, "exec answered 503 yet recorded")
				return nil
			}
		case isCode(err, "environment_unreachable"):
			var ae *apiError
			errors.As(err, &ae)
			r.c.record(request{method: http.MethodPost, path: s.path("/commands"), org: s.org.slug, env: s.env}, ae.Status, ae.Code, []byte(ae.Body))
			m := mayStartRE.FindStringSubmatch(ae.Body)
			if m == nil {
				return fmt.Errorf("exec answered 502 without naming its command: %s", ae.Body)
			}
			c.id, _ = strconv.ParseInt(m[1], 10, 64)
			return nil
		case errors.Is(err, errAmbiguous):
			id, found, err := r.findByTag(ctx, c)
			if err != nil {
				return err
			}
			if found {
				c.id = id
				return nil
			}
		default:
			return fmt.Errorf("exec %q: %w", c.tag, err)
		}
	}
}

// findByTag looks for c's command in its session's history.
func (r *chaosRun) findByTag(ctx context.Context, c *cmdRecord) (int64, bool, error) {
	var h struct {
		Items []struct {
			ID      int64  `json:"id"`
			Command string `json:"command"`
		} `json:"items"`
	}
	if _, err := r.c.do(ctx, request{method: http.MethodGet, path: c.s.path("/commands?limit=200"), token: c.s.org.key, org: c.s.org.slug, env: c.s.env,
		retryOn: []int{http.StatusServiceUnavailable}, retrySuspended: true}, &h); err != nil {
		return 0, false, fmt.Errorf("look for %q in the history: %w", c.tag, err)
	}
	for _, it := range h.Items {
		if strings.Contains(it.Command, c.tag) {
			return it.ID, true, nil
		}
	}
	return 0, false, nil
}

// follow reads c's output from cursor 0 to its end, as a client does
// through the gateway, checking that no chunk comes twice; it returns the
// stdout and the final state.
func (r *chaosRun) follow(ctx context.Context, c *cmdRecord) (string, string, error) {
	var out strings.Builder
	var cursor uint64
	progress := time.Now()
	var eofSent time.Time
	for {
		if c.eofPending && time.Since(eofSent) > time.Second {
			eofSent = time.Now()
			r.sendPendingEOF(ctx, c)
		}
		if cursor == 0 && time.Since(progress) > unstartedAfter {
			// Nothing came for a while: a command whose create died with
			// its replica is never sent to agentd and ends lost only after
			// two minutes (docs/terminal-gateway.md). The driver does not
			// wait for that; the checks treat it as never started.
			if acked, err := r.acked(ctx, c); err == nil && !acked {
				r.mu.Lock() // a second reader may find the same
				first := !c.unknownCommit
				c.unknownCommit = true
				if first {
					r.ops["exec recorded but never started (its replica died before agentd heard of it)"]++
				}
				r.mu.Unlock()
				return "", "running", nil
			}
			progress = time.Now()
		}
		var o execOutput
		sent := time.Now()
		c.s.set(c.id, "following command %d (%s) at cursor %d, progress %s ago", c.id, c.tag, cursor, time.Since(progress).Round(time.Second))
		path := c.s.path("/commands/%d/output?cursor=%d&wait_ms=2000", c.id, cursor)
		if _, err := r.c.do(ctx, request{method: http.MethodGet, path: path, token: c.s.org.key, org: c.s.org.slug, env: c.s.env,
			retryOn: []int{http.StatusBadGateway, http.StatusServiceUnavailable}, retrySuspended: true}, &o); err != nil {
			return out.String(), "", fmt.Errorf("follow command %d (%s): %w", c.id, c.tag, err)
		}
		for _, ch := range o.Chunks {
			if ch.ID <= cursor {
				r.violate("command %d (%s): chunk %d came again after cursor %d", c.id, c.tag, ch.ID, cursor)
				continue
			}
			cursor = ch.ID
			if ch.Stream == "stdout" {
				out.Write(ch.Data)
			}
		}
		if o.NextCursor > cursor {
			cursor = o.NextCursor
		}
		if o.State != "running" && !o.More {
			return out.String(), o.State, nil
		}
		if len(o.Chunks) > 0 {
			progress = time.Now()
		} else if time.Since(sent) < 100*time.Millisecond {
			// Answered at once with nothing (from the recording of a
			// command agentd forgot, not yet recorded as ended): do not
			// spin.
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// sendPendingEOF sends c's EOF again, which was answered "has not started
// yet": that answer again is expected (not recorded) until agentd has the
// command; an ended one needs none.
func (r *chaosRun) sendPendingEOF(ctx context.Context, c *cmdRecord) {
	s := c.s
	s.set(c.id, "sending the EOF of command %d (%s) again", c.id, c.tag)
	_, err := r.c.do(ctx, request{method: http.MethodPost, path: s.path("/commands/%d/stdin", c.id), token: s.org.key, body: map[string]any{"eof": true},
		org: s.org.slug, env: s.env, once: true, retrySuspended: true,
		accept: []string{"command_ended", "environment_unreachable", "not_running", "database_unavailable", "audit_unavailable"}}, nil)
	if err == nil || isCode(err, "command_ended") || isCode(err, "not_running") {
		c.eofPending = false
	}
}

// unstartedAfter is how long a command may show nothing before the
// driver asks whether agentd ever acknowledged it.
const unstartedAfter = 8 * time.Second

// acked reads whether agentd acknowledged c's create (from the database:
// the API does not say).
func (r *chaosRun) acked(ctx context.Context, c *cmdRecord) (bool, error) {
	db, err := r.orgDB(ctx, c.s.org)
	if err != nil {
		return false, err
	}
	var acked bool
	err = db.WithContext(ctx).Raw("SELECT agentd_acked FROM commands WHERE id = ?", c.id).Scan(&acked).Error
	return acked, err
}

// counterOp runs a counter (`seq 1 N` with sleeps), followed by its
// starter and, one time in three, by a second reader.
func (r *chaosRun) counterOp(ctx context.Context, s *chaosSession) error {
	c := r.newCommand(s, "counter")
	c.n = 20 + rand.IntN(41)
	c.command = fmt.Sprintf(": %s; for i in $(seq 1 %d); do echo $i; sleep 0.05; done", c.tag, c.n)
	if err := r.exec(ctx, c, nil); err != nil {
		return err
	}
	r.keep(c)
	if c.unknownCommit {
		return nil
	}
	r.count(r.ops, "counter")
	var wg sync.WaitGroup
	var werr error
	if rand.IntN(3) == 0 {
		c.watched = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.watcher, _, werr = r.follow(ctx, c)
		}()
	}
	var err error
	c.client, c.state, err = r.follow(ctx, c)
	wg.Wait()
	c.ended = time.Now()
	return errors.Join(err, werr)
}

// interactiveOp runs a read loop and types lines into it through stdin,
// then closes stdin. A stdin write that got no answer is not sent again
// (it may have arrived): that line may show at most once.
func (r *chaosRun) interactiveOp(ctx context.Context, s *chaosSession) (err error) {
	c := r.newCommand(s, "interactive")
	c.n = 5 + rand.IntN(11)
	c.ambiguous, c.twice = map[int]bool{}, map[int]bool{}
	c.command = fmt.Sprintf(": %s; while read l; do echo \"got $l\"; done", c.tag)
	if err := r.exec(ctx, c, map[string]any{"stdin": true}); err != nil {
		return err
	}
	r.keep(c)
	if c.unknownCommit {
		return nil
	}
	r.count(r.ops, "interactive")
	defer func() {
		if err != nil && ctx.Err() == nil {
			// The driver gave up on it: end it, so the run can settle.
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_, _ = r.c.do(kctx, request{method: http.MethodDelete, path: s.path("/commands/%d", c.id), token: s.org.key, org: s.org.slug, env: s.env,
				accept: []string{"command_ended"}, retryOn: []int{http.StatusBadGateway, http.StatusServiceUnavailable}, retrySuspended: true}, nil)
			c.state = "killed"
		}
	}()
	ended := false
	stdin := func(body map[string]any, k int) error {
		if ended {
			c.ambiguous[k] = true
			return nil
		}
		var err error
		for {
			s.set(c.id, "typing line %d into command %d (%s)", k, c.id, c.tag)
			_, err = r.c.do(ctx, request{method: http.MethodPost, path: s.path("/commands/%d/stdin", c.id), token: s.org.key, body: body,
				org: s.org.slug, env: s.env, once: true, retrySuspended: true,
				accept: []string{"command_ended", "environment_unreachable", "not_running", "database_unavailable", "audit_unavailable"}}, nil)
			if !isCode(err, "database_unavailable") && !isCode(err, "audit_unavailable") {
				break
			}
			// Nothing reached agentd, but the chunk may have been
			// committed as the connection broke: the retry may record
			// the line a second time.
			var ae *apiError
			errors.As(err, &ae)
			r.c.record(request{method: http.MethodPost, path: s.path("/commands/%d/stdin", c.id), org: s.org.slug, env: s.env}, ae.Status, ae.Code, []byte(ae.Body))
			c.twice[k] = true
			time.Sleep(300 * time.Millisecond)
		}
		switch {
		case err == nil:
		case errors.Is(err, errAmbiguous) || isCode(err, "environment_unreachable"):
			if isCode(err, "environment_unreachable") {
				var ae *apiError
				errors.As(err, &ae)
				r.c.record(request{method: http.MethodPost, path: s.path("/commands/%d/stdin", c.id), org: s.org.slug, env: s.env}, ae.Status, ae.Code, []byte(ae.Body))
				c.eofRefused = k == 0
				c.eofUnstarted = k == 0 && strings.Contains(ae.Body, "has not started in its environment yet")
			}
			c.ambiguous[k] = true
		case isCode(err, "command_ended") || isCode(err, "not_running"):
			// Its agentd restarted under it: judged by its end state.
			ended = true
			c.ambiguous[k] = true
		default:
			return fmt.Errorf("stdin to command %d (%s): %w", c.id, c.tag, err)
		}
		return nil
	}
	for k := 1; k <= c.n; k++ {
		if err := stdin(map[string]any{"text": fmt.Sprintf("%s-%d\n", c.tag, k)}, k); err != nil {
			return err
		}
		time.Sleep(time.Duration(50+rand.IntN(200)) * time.Millisecond)
	}
	// EOF ends the loop; one that got no answer is sent again, a few
	// times (a second EOF is refused or ignored, never typed). One
	// answered "has not started yet" is left to follow, which sends it
	// again while the command may still start (a command that starts
	// without its EOF reads stdin for ever) and stops when it never will.
	for range 5 {
		if ended {
			break
		}
		c.eofRefused, c.eofUnstarted = false, false
		if err := stdin(map[string]any{"eof": true}, 0); err != nil {
			return err
		}
		if c.eofUnstarted {
			c.eofPending = true
			break
		}
		if !c.ambiguous[0] || c.eofRefused {
			break
		}
		delete(c.ambiguous, 0)
	}
	c.client, c.state, err = r.follow(ctx, c)
	c.ended = time.Now()
	return err
}

// fileOp writes a file with a command and reads it back through the
// gateway's file API.
func (r *chaosRun) fileOp(ctx context.Context, s *chaosSession) error {
	c := r.newCommand(s, "file")
	name := c.tag + ".txt"
	c.command = fmt.Sprintf(": %s; seq 1 200 | sed 's/^/%s-/' > %s", c.tag, c.tag, name)
	if err := r.exec(ctx, c, map[string]any{"wait_ms": 5000}); err != nil {
		return err
	}
	r.keep(c)
	if c.unknownCommit {
		return nil
	}
	r.count(r.ops, "file write+read")
	var err error
	c.client, c.state, err = r.follow(ctx, c)
	c.ended = time.Now()
	if err != nil || c.state != "exited" {
		return err
	}
	var want strings.Builder
	for i := 1; i <= 200; i++ {
		fmt.Fprintf(&want, "%s-%d\n", c.tag, i)
	}
	s.set(c.id, "reading %s back", name)
	body, err := r.c.do(ctx, request{method: http.MethodGet, path: s.path("/files?path=%s", name), token: s.org.key, org: s.org.slug, env: s.env,
		retryOn: []int{http.StatusBadGateway, http.StatusServiceUnavailable}, retrySuspended: true}, nil)
	if err != nil {
		return fmt.Errorf("read %s back: %w", name, err)
	}
	if string(body) != want.String() {
		r.violate("file %s read back through the gateway is not what command %d wrote (%d bytes, want %d)", name, c.id, len(body), want.Len())
	}
	return nil
}

// probe runs a short command on env in the first session of the first
// org there and follows it to its end; it reports whether it exited.
func (r *chaosRun) probe(ctx context.Context, env string) bool {
	var s *chaosSession
	for _, cand := range r.sessions {
		if cand.env == env && cand.org == r.orgs[0] {
			s = cand
			break
		}
	}
	if s == nil {
		return false
	}
	for ctx.Err() == nil {
		c := r.newCommand(s, "probe")
		c.command = fmt.Sprintf(": %s; echo %s", c.tag, c.tag)
		if err := r.exec(ctx, c, map[string]any{"wait_ms": 5000}); err != nil {
			r.violate("probe on %s: %v", env, err)
			return false
		}
		r.keep(c)
		if c.unknownCommit {
			continue
		}
		var err error
		c.client, c.state, err = r.follow(ctx, c)
		c.ended = time.Now()
		if err != nil {
			r.violate("probe on %s: %v", env, err)
			return false
		}
		if c.state == "exited" {
			return true
		}
		// A probe lost to the restart it measures: try again.
	}
	return false
}
