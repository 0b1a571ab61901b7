package recorder

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/audit"
	"github.com/gatehouse/gatehouse/internal/authz"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/recordings"
	"github.com/gatehouse/gatehouse/internal/sessions"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/tenant"
)

// Org is one organization as the recorder works in it.
type Org struct {
	Slug  string
	DB    *gorm.DB
	Audit *audit.Log
	// Sessions locates a command's session and hears whether its agentd
	// answered.
	Sessions Sessions
	// Revoked ends when the org is suspended or deleted: followers stop at
	// once. Nil never ends.
	Revoked context.Context
}

// Sessions is what the recorder needs of the sessions domain.
type Sessions interface {
	Locate(ctx context.Context, a *authz.Actor, sessionID int64) (sessions.Target, error)
	ReportUnreachable(ctx context.Context, sessionID int64, cause error) (bool, error)
	ReportReachable(ctx context.Context, sessionID int64) error
}

// Followers record the output of running commands, each from its start
// until it ends, whether or not any client polls. A follower holds a lease
// on its command's row, renewed for all of this process's followed
// commands of an org by one statement every third of the lease: one
// replica follows a command at a time, and when a replica dies its
// commands' leases lapse and another replica (or the same one after a restart) takes over from
// the last recorded chunk, so nothing is missed or stored twice.
type Followers struct {
	// Owner names this process in leases; unique per process start.
	Owner string
	// OpenOrg gives a follower the org it works in, as the system; release
	// is called when the follower is done.
	OpenOrg func(ctx context.Context, slug string) (org Org, release func(), err error)
	// ListOrgs lists the active orgs, for the sweep that adopts commands
	// whose follower died.
	ListOrgs func(ctx context.Context) ([]string, error)
	HTTP     *http.Client
	// Lease is how long a follower's claim lasts without a write.
	Lease time.Duration
	// Wait is the long-poll wait of each read from agentd.
	Wait time.Duration
	// Gather is how long a small batch of a running command waits for
	// the output after it before both are stored in one commit (0:
	// gatherWindow).
	Gather time.Duration
	// LiveBudget bounds the bytes of recent output kept in memory for
	// clients' polls, over every command followed here (0:
	// DefaultLiveBudget).
	LiveBudget int64
	Logger     *slog.Logger
	Now        func() time.Time

	// Clients reach agentd; the gateway uses them too.
	Clients envs.AgentdClients

	// pending holds creates sent without an answer (pendingKey →
	// agentd.CreateSessionRequest).
	pending sync.Map

	mu      sync.Mutex
	running map[followKey]bool
	// live is the output just read of the commands followed here, which
	// clients' polls share.
	live live
	// renewing is the context the lease renewer runs under (one per
	// Start).
	renewing context.Context
	// indexed names the orgs whose ended commands all have a search
	// entry (the backfill of commands that ended before search existed),
	// each with the database that was true of: an org created again under
	// the same slug (perhaps attached to a database with old commands) is
	// looked at afresh.
	indexed map[string]*gorm.DB
	wg      sync.WaitGroup
	// ctx is the context every follower runs under, made by Start or by
	// the first follower asked for before it; stop cancels it.
	ctx     context.Context
	stop    context.CancelFunc
	started bool
}

type followKey struct {
	org string
	id  int64
}

// recorderActor is the actor the followers act as.
func recorderActor() *authz.Actor { return authz.System("recorder") }

// LeaseFor is how long a follower's claim lasts without a write: a
// command's starter sets it on the record it writes.
func (f *Followers) LeaseFor() time.Duration { return f.lease() }

// HTTPFor is the client for calls to e's agentd, shared with the gateway
// so both reuse one pool of connections.
func (f *Followers) HTTPFor(e envs.Environment) *http.Client { return f.Clients.For(f.HTTP, e) }

func (f *Followers) lease() time.Duration {
	if f.Lease > 0 {
		return f.Lease
	}
	return time.Minute
}

// defaultWait is a follower's long-poll of agentd: just under agentd's
// longest (agentd.MaxWait), so a quiet command costs its follower one
// request a minute; agentd answers at once when output comes or the
// command ends.
const defaultWait = agentd.MaxWait - 5*time.Second

func (f *Followers) wait() time.Duration {
	if f.Wait > 0 {
		return f.Wait
	}
	// Up to a sixth shorter at random: commands started (or adopted by a
	// sweep) together do not all wake together a minute later.
	return defaultWait - rand.N(defaultWait/6)
}

func (f *Followers) now() time.Time {
	if f.Now != nil {
		return f.Now().UTC()
	}
	return time.Now().UTC()
}

func (f *Followers) logger() *slog.Logger {
	if f.Logger != nil {
		return f.Logger
	}
	return slog.Default()
}

// ErrStarted is Start called a second time.
var ErrStarted = errors.New("recorder: followers already started")

// Start makes the followers ready, once: a second call is ErrStarted. The
// followers' context keeps ctx's values, not its cancellation; Stop ends
// them. Followers asked for before Start run under a context of their own
// (without ctx's values) that Stop ends too, and Start keeps it.
func (f *Followers) Start(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started {
		return ErrStarted
	}
	f.started = true
	if f.ctx == nil {
		f.ctx, f.stop = context.WithCancel(context.WithoutCancel(ctx))
	}
	return nil
}

// Stop ends every follower and waits for them. Their leases lapse and
// another replica (or this one, restarted) takes over.
func (f *Followers) Stop() {
	f.mu.Lock()
	stop := f.stop
	f.mu.Unlock()
	if stop != nil {
		stop()
	}
	f.wg.Wait()
}

// Active counts the commands this process follows now.
func (f *Followers) Active() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.running)
}

// Follow makes sure command id of org is followed by this process (unless
// another replica holds its lease).
func (f *Followers) Follow(org string, id int64) { f.start(org, id, nil) }

// FollowNew follows a command this process has just started with its own
// lease, recording first (agentd's answer to the start) without asking
// again: a command that already ended is recorded with one commit.
func (f *Followers) FollowNew(org Org, c recordings.Command, first *agentd.SessionResponse) {
	// Clients' polls are answered from the follower's reads from the
	// moment the starter answers (a poll may arrive before the
	// follower's goroutine runs).
	f.publish(liveKey{org.Slug, c.ID}, org.DB, 0, first)
	// The follower starts following once the starter's answer is on its
	// way: storing the first answer (for a command as quick as `true`, its
	// end and command.end too) would otherwise compete for the CPU with
	// writing that answer, and the caller would wait for its recording.
	// Nothing waits on it meanwhile: clients read the window, and agentd
	// keeps the output until it is stored.
	f.start(org.Slug, c.ID, &started{cmd: c, first: first, after: answerFirst})
}

// answerFirst is how long FollowNew lets the starter's answer go first.
const answerFirst = 2 * time.Millisecond

// started is what the starter of a command knows of it, and how long
// its follower lets the starter's answer go first.
type started struct {
	cmd   recordings.Command
	first *agentd.SessionResponse
	after time.Duration
}

func (f *Followers) start(org string, id int64, known *started) {
	k := followKey{org, id}
	f.mu.Lock()
	if f.running == nil {
		f.running = map[followKey]bool{}
	}
	if f.ctx == nil {
		f.ctx, f.stop = context.WithCancel(context.Background())
	}
	if f.running[k] {
		f.mu.Unlock()
		return
	}
	if f.ctx.Err() != nil {
		f.mu.Unlock()
		f.live.forget(liveKey{org, id})
		f.dropPending(org, id)
		return
	}
	f.running[k] = true
	ctx := f.ctx
	f.wg.Add(1)
	if f.renewing != ctx {
		f.renewing = ctx
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.renew(ctx)
		}()
	}
	f.mu.Unlock()
	go func() {
		defer f.wg.Done()
		defer func() {
			f.mu.Lock()
			delete(f.running, k)
			f.mu.Unlock()
		}()
		// Clients of the command ask agentd (or read the recording) once
		// its follower here is gone.
		defer f.live.forget(liveKey{org, id})
		// A create still unanswered when following ends (or never began:
		// the org could not be opened) is not sent again: its environment
		// values leave memory with it.
		defer f.dropPending(org, id)
		if known != nil && known.after > 0 {
			pause := time.NewTimer(known.after)
			select {
			case <-pause.C:
			case <-ctx.Done():
				pause.Stop()
				return
			}
		}
		if err := f.follow(ctx, org, id, known); err != nil && ctx.Err() == nil {
			f.logger().Warn("recording follower stopped", "org", org, "command", id, "error", err)
		}
	}()
}

// follow records command id until it ends or the lease is lost.
func (f *Followers) follow(ctx context.Context, slug string, id int64, known *started) error {
	org, release, err := f.OpenOrg(ctx, slug)
	if err != nil {
		return err
	}
	defer release()
	lk := liveKey{slug, id}
	ctx, cancel := tenant.BindRevoked(ctx, org.Revoked)
	defer cancel()
	backoff := 200 * time.Millisecond
	// retry waits before the next attempt after a failure that may pass
	// (the database or agentd away), longer each time.
	retry := func() bool {
		if !sleep(ctx, backoff) {
			return false
		}
		backoff = min(backoff*2, maxBackoff)
		return true
	}
	// c is the command as the last write left it (nil: read it again);
	// ahead is agentd's next batch, read while the one before was stored.
	var c *recordings.Command
	var ahead *aheadRead
	defer func() { ahead.drop() }()
	if known != nil && known.first != nil {
		var over bool
		if c, over = f.recordFirst(ctx, org, known); over {
			return nil
		}
	}
	if known == nil {
		if held, err := f.acquire(ctx, org, id, retry); !held || err != nil {
			return err
		}
	}
	for ctx.Err() == nil {
		if c == nil { // else carried over from the last write
			got, err := recordings.Get(ctx, org.DB, id)
			if store.IsUnavailable(err) {
				// The database is away (an outage): the command keeps
				// running and agentd keeps its output; follow on when
				// the database is back, from the last stored chunk.
				f.live.stalled(lk)
				if !retry() {
					return ctx.Err()
				}
				continue
			}
			if err != nil {
				return err
			}
			c = &got
		}
		if c.Ended() {
			return nil
		}
		t, err := org.Sessions.Locate(ctx, recorderActor(), c.SessionID)
		if err != nil {
			if sessions.IsFinal(err) {
				return f.finish(ctx, org, *c, recordings.End{State: recordings.StateLost, Reason: "its session ended: " + err.Error(), At: f.now()})
			}
			// Read the command again next time: another replica may
			// have ended it meanwhile.
			c = nil
			f.live.stalled(lk)
			if !retry() {
				return ctx.Err()
			}
			continue
		}
		done, next, err := f.step(ctx, org, t, *c, ahead)
		ahead = next
		if err != nil {
			c, ahead = nil, nil
			if errors.Is(err, recordings.ErrLeaseLost) {
				return nil
			}
			f.live.stalled(lk)
			if store.IsUnavailable(err) || agentd.Unanswered(err) {
				// The database or agentd is away (or agentd has not
				// started the command yet): keep the lease alive, over
				// the wait before the next attempt too, and try again;
				// nothing is judged from a failed read. A lease left to
				// lapse here would have every replica's sweep adopt the
				// command and wait on it side by side, the row naming a
				// replica that may be long dead.
				if held, err := recordings.Acquire(ctx, org.DB, id, f.Owner, f.now(), f.now().Add(f.lease()+backoff)); err == nil && !held {
					return nil // another replica took it over
				}
				if !retry() {
					return ctx.Err()
				}
				continue
			}
			return err
		}
		backoff = 200 * time.Millisecond
		if done.ended {
			return nil
		}
		c = &done.cmd
	}
	return ctx.Err()
}

// recordFirst records the starter's first answer of a command, as it is:
// the starter holds the lease already. It returns the command as stored
// (nil: read it again), or over when following it is done (it ended, or
// another replica took it).
func (f *Followers) recordFirst(ctx context.Context, org Org, known *started) (c *recordings.Command, over bool) {
	lk := liveKey{org.Slug, known.cmd.ID}
	f.publish(lk, org.DB, 0, known.first)
	done, err := f.record(ctx, org, known.cmd, known.first, nil)
	if err == nil {
		f.storedTo(lk, uint64(done.cmd.LastChunk))
	}
	if (err == nil && done.ended) || errors.Is(err, recordings.ErrLeaseLost) {
		return nil, true
	}
	if err == nil {
		return &done.cmd, false
	}
	return nil, false // read on from where the record stands
}

// acquire takes command id's lease for this process, waiting out a
// database that is away (retry); held is false when another replica
// follows it or ctx ended.
func (f *Followers) acquire(ctx context.Context, org Org, id int64, retry func() bool) (held bool, err error) {
	for {
		ok, err := recordings.Acquire(ctx, org.DB, id, f.Owner, f.now(), f.now().Add(f.lease()))
		switch {
		case err == nil:
			return ok, nil
		case !store.IsUnavailable(err):
			return false, err
		case !retry():
			return false, ctx.Err()
		}
	}
}

// maxBackoff bounds the wait between a follower's attempts while the
// database or agentd is away: after an outage it follows on within this.
const maxBackoff = 5 * time.Second

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// createGrace is how long after its record a command agentd never
// acknowledged may still be starting: the exec's own create is bounded by
// the longest wait plus the call timeout, well inside it.
const createGrace = 2 * time.Minute

// errNotStarted is a follower's read of a command whose create agentd has
// not acknowledged yet: read again shortly.
var errNotStarted = errors.New("agentd has not started the command yet")

// notStarted handles agentd not knowing a command it never acknowledged:
// the create is sent again when this process still holds it (the id is
// the console's, so a create that did arrive answers id_in_use), else
// the follower waits out createGrace before calling the command lost.
func (f *Followers) notStarted(ctx context.Context, org Org, cl *agentd.Client, c recordings.Command) (stepResult, *aheadRead, error) {
	// A command being ended (its session's close marked it) is never sent
	// again: read the mark as it stands, not as this follower last saw it.
	if fresh, err := recordings.Get(ctx, org.DB, c.ID); err != nil {
		return stepResult{}, nil, err
	} else if fresh.Reason != "" {
		f.CreateDone(org, c.ID)
		return stepResult{ended: true}, nil, f.finish(ctx, org, fresh, recordings.End{State: recordings.StateLost,
			Reason: fresh.Reason, At: f.now()})
	}
	if req, ok := f.pendingCreate(org, c.ID); ok {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		resp, err := cl.CreateSession(cctx, req)
		outcome, ae := SortCreate(err)
		switch outcome {
		case CreateStarted:
			f.CreateDone(org, c.ID)
			stored, err := f.record(ctx, org, c, resp, nil)
			return stored, nil, err
		case CreateArrived:
			f.CreateDone(org, c.ID) // it did arrive: read it next
			return stepResult{cmd: c}, nil, nil
		case CreateRefused:
			f.CreateDone(org, c.ID)
			return stepResult{ended: true}, nil, f.finish(ctx, org, c, recordings.End{State: recordings.StateLost,
				Reason: "agentd refused to start it: " + ae.Message, At: f.now()})
		}
		return stepResult{}, nil, err
	}
	if f.now().Before(c.StartedAt.Add(createGrace)) {
		return stepResult{}, nil, errNotStarted
	}
	return stepResult{ended: true}, nil, f.finish(ctx, org, c, recordings.End{State: recordings.StateLost,
		Reason: "agentd never acknowledged starting it", At: f.now()})
}

// stepResult is what one step left: the command as stored, and whether it
// ended.
type stepResult struct {
	cmd   recordings.Command
	ended bool
}

// aheadRead is a read of agentd's next batch, made while the batch before
// it is being stored; it acknowledges only what was stored before that.
type aheadRead struct {
	cursor uint64 // it reads after this chunk: the last of the batch being stored
	cancel context.CancelFunc
	done   chan struct{}
	resp   *agentd.SessionResponse
	err    error
}

// drop abandons a read ahead whose answer will not be used, and waits for
// it to end (a nil one is nothing to drop).
func (a *aheadRead) drop() {
	if a != nil {
		a.cancel()
		<-a.done
	}
}

// readAhead starts reading the batch after cursor, waiting for output up
// to wait (aheadWaitFor), and hands what it read to publish at once.
func (f *Followers) readAhead(ctx context.Context, cl *agentd.Client, agentdID string, cursor, stored uint64, wait time.Duration, publish func(uint64, *agentd.SessionResponse)) *aheadRead {
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	a := &aheadRead{cursor: cursor, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.resp, a.err = cl.ReadAhead(pctx, agentdID, cursor, stored, wait)
		if a.err == nil && a.resp != nil && news(a.resp) {
			// Readers get it now, not once the batch before it is
			// stored: a terminal's next echo arrives while the last is
			// being stored, and would otherwise wait for that commit.
			publish(cursor, a.resp)
		}
	}()
	return a
}

// A small batch of a running command waits up to gatherWindow for the
// output that follows it, up to gatherBytes, and is stored with it in one
// commit: a terminal's echoes while someone types (or a program writing a
// line at a time) cost one commit per window, not one per write, and the
// database writes do not queue behind the keystrokes' own. Readers get
// each part the moment it arrives; agentd keeps all of it until it is
// stored (the reads acknowledge only what was stored before), so a
// console that dies meanwhile loses nothing: its successor reads it again.
const (
	gatherWindow = 20 * time.Millisecond // Followers.Gather's default
	gatherBytes  = 64 << 10
	gatherChunks = 256
)

// gathering reports whether resp is a small batch of a running command
// from an agentd that honours ack_to (an older one would release it).
func gathering(resp *agentd.SessionResponse) bool {
	return resp.AckTo && resp.State == agentd.StateRunning && !resp.More && !resp.Truncated &&
		len(resp.Chunks) > 0 && len(resp.Chunks) < gatherChunks && chunkBytes(resp.Chunks) < gatherBytes
}

// news reports an answer that tells a reader something: output, an end,
// or more waiting in agentd.
func news(resp *agentd.SessionResponse) bool {
	return len(resp.Chunks) > 0 || resp.State != agentd.StateRunning || resp.More
}

func chunkBytes(chunks []agentd.Chunk) int {
	n := 0
	for _, ch := range chunks {
		n += len(ch.Data)
	}
	return n
}

// gather reads what follows resp for up to gatherWindow and returns resp
// with it joined, and when each chunk arrived. publish hands each read to
// the command's readers at once. An answer it cannot join (truncated, or
// a failed read) is left unread: agentd still holds it for the next read.
func (f *Followers) gather(ctx context.Context, cl *agentd.Client, c recordings.Command, resp *agentd.SessionResponse, publish func(uint64, *agentd.SessionResponse)) (*agentd.SessionResponse, []time.Time) {
	first := f.now()
	stamps := make([]time.Time, len(resp.Chunks))
	for i := range stamps {
		stamps[i] = first
	}
	joined := *resp
	joined.Chunks = append([]agentd.Chunk(nil), resp.Chunks...)
	window := f.Gather
	if window <= 0 {
		window = gatherWindow
	}
	deadline := time.Now().Add(window)
	for gathering(&joined) {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		rctx, cancel := context.WithTimeout(ctx, left+10*time.Second)
		more, err := cl.ReadAhead(rctx, c.AgentdID, joined.NextCursor, uint64(c.LastChunk), left)
		cancel()
		if err != nil || more == nil || more.Truncated || !more.AckTo || !news(more) {
			break
		}
		publish(joined.NextCursor, more)
		at := f.now()
		for range more.Chunks {
			stamps = append(stamps, at)
		}
		joined.Chunks = append(joined.Chunks, more.Chunks...)
		joined.NextCursor, joined.State, joined.ExitCode, joined.More, joined.DroppedBytes = more.NextCursor, more.State, more.ExitCode, more.More, more.DroppedBytes
	}
	return &joined, stamps
}

// aheadWait is how long a read ahead after a small batch waits for more
// output: an interactive command's next echo usually comes within it (the
// next keystroke arrives while the last echo is stored). Past it the
// follower reads again as it does after any batch.
const aheadWait = 50 * time.Millisecond

// aheadWaitFor is the wait of the read ahead of resp: aheadWait after a
// small batch, none after a large one. What agentd holds unacknowledged
// is the batch being stored; when that filled its buffer, the command
// cannot write on until the batch is stored and acknowledged, and a read
// ahead that waited for its output would only stall the follower.
func aheadWaitFor(resp *agentd.SessionResponse) time.Duration {
	if resp.More || chunkBytes(resp.Chunks) >= gatherBytes {
		return 0
	}
	return aheadWait
}

// step reads one batch from agentd (or takes the one read ahead), starts
// reading the next while it stores this one and, when the command ended
// and nothing more is buffered, records its end. Storing a batch is the
// slow part of following bulk output; overlapping it with the next read
// roughly doubles the rate agentd's output is recorded at.
func (f *Followers) step(ctx context.Context, org Org, t sessions.Target, c recordings.Command, ahead *aheadRead) (stepResult, *aheadRead, error) {
	cl := agentd.NewClient(t.AgentdURL, t.AgentdToken, f.HTTPFor(t.Environment))
	var resp *agentd.SessionResponse
	var err error
	lk := liveKey{org.Slug, c.ID}
	readFrom := uint64(c.LastChunk)
	if ahead != nil {
		<-ahead.done
		ahead.cancel()
		resp, err = ahead.resp, ahead.err
		readFrom = ahead.cursor
		if err != nil || ahead.cursor != uint64(c.LastChunk) || (len(resp.Chunks) == 0 && resp.State == agentd.StateRunning && !resp.More) {
			// Failed, stale, or nothing yet: read again, acknowledging
			// what is stored and waiting for output.
			resp, err = nil, nil
		}
	}
	if resp == nil {
		pctx, cancel := context.WithTimeout(ctx, f.wait()+30*time.Second)
		defer cancel()
		readFrom = uint64(c.LastChunk)
		wait := f.wait()
		if recordings.IndexLags(c) {
			// Output waits to be indexed for search: come back soon,
			// output or not, so it is searchable within seconds.
			wait = min(wait, recordings.IndexEvery)
		}
		resp, err = cl.Poll(pctx, c.AgentdID, readFrom, wait)
	}
	var ae *agentd.Error
	if errors.As(err, &ae) && ae.Unknown() {
		if !c.Acked {
			// agentd never answered for it: its create may still be on
			// the way, or lost on the way.
			return f.notStarted(ctx, org, cl, c)
		}
		// agentd knew the command and forgot it: its environment
		// restarted. What was recorded is all there is.
		return stepResult{ended: true}, nil, f.finish(ctx, org, c, recordings.End{State: recordings.StateLost,
			Reason: "agentd no longer knows the command (its environment restarted)", At: f.now()})
	}
	if err != nil {
		if agentd.Unanswered(err) {
			// Only an agentd that did not answer (or answered 5xx) counts
			// toward losing the session; its refusals describe the request.
			if _, rerr := org.Sessions.ReportUnreachable(ctx, c.SessionID, err); rerr != nil {
				f.logger().Warn("recording follower: record agentd failure", "org", org.Slug, "session", c.SessionID, "error", rerr)
			}
		}
		return stepResult{}, nil, err
	}
	// Clients polling this command get it now, before it is stored (as
	// they did asking agentd themselves).
	f.publish(lk, org.DB, readFrom, resp)
	if err := org.Sessions.ReportReachable(ctx, c.SessionID); err != nil {
		f.logger().Warn("recording follower: clear agentd failures", "org", org.Slug, "session", c.SessionID, "error", err)
	}
	publish := func(cursor uint64, r *agentd.SessionResponse) { f.publish(lk, org.DB, cursor, r) }
	var stamps []time.Time
	if gathering(resp) {
		resp, stamps = f.gather(ctx, cl, c, resp, publish)
	}
	var next *aheadRead
	// Only an agentd that said it honours ack_to is read ahead of: an
	// older one would release the batch being stored.
	if resp.AckTo && len(resp.Chunks) > 0 && (resp.State == agentd.StateRunning || resp.More) {
		next = f.readAhead(ctx, cl, c.AgentdID, resp.NextCursor, uint64(c.LastChunk), aheadWaitFor(resp), publish)
	}
	stored, err := f.record(ctx, org, c, resp, stamps)
	if err != nil {
		next.drop()
		next = nil
	} else {
		f.storedTo(lk, uint64(stored.cmd.LastChunk))
	}
	return stored, next, err
}

// record stores one answer of agentd: its output, and when the command
// ended with nothing more buffered, its end too, in the same commit.
// stamps, when given, say when each chunk arrived (gather); without them
// every chunk arrived now.
func (f *Followers) record(ctx context.Context, org Org, c recordings.Command, resp *agentd.SessionResponse, stamps []time.Time) (stepResult, error) {
	at := f.now()
	out := recordings.Output{Dropped: resp.DroppedBytes, NextCursor: resp.NextCursor, Audit: org.Audit}
	if !resp.Truncated {
		out.Dropped = 0
	}
	for i, ch := range resp.Chunks {
		chAt := at
		if i < len(stamps) {
			chAt = stamps[i]
		}
		out.Chunks = append(out.Chunks, recordings.Chunk{Seq: ch.ID, Stream: ch.Stream, At: chAt, Data: ch.Data})
	}
	if resp.State != agentd.StateRunning && !resp.More {
		stored, err := recordings.CompleteFollowed(ctx, org.DB, org.Audit, c, f.Owner, out,
			recordings.End{State: resp.State, ExitCode: resp.ExitCode, At: at}, recorderActor().AuditActor())
		return stepResult{cmd: stored, ended: err == nil}, err
	}
	// One statement, and none for a quiet batch: the lease is renewed for
	// every followed command at once (renew).
	stored, err := recordings.AppendFollowed(ctx, org.DB, c, f.Owner, out)
	return stepResult{cmd: stored}, err
}

// finish records the end of c with its end event.
func (f *Followers) finish(ctx context.Context, org Org, c recordings.Command, end recordings.End) error {
	_, err := recordings.Finish(ctx, org.DB, org.Audit, c.ID, f.Owner, end, recorderActor().AuditActor())
	if errors.Is(err, recordings.ErrLeaseLost) {
		return nil
	}
	return err
}

// FinishRefused ends the record of a command agentd refused to start.
func (f *Followers) FinishRefused(ctx context.Context, org Org, c recordings.Command, ae *agentd.Error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	end := recordings.End{State: recordings.StateLost, Reason: "agentd refused to start it: " + ae.Message, At: f.now()}
	if _, err := recordings.Finish(ctx, org.DB, org.Audit, c.ID, "", end, audit.Actor{Type: audit.ActorSystem, Name: "gateway"}); err != nil {
		f.logger().Warn("gateway: record refused command", "org", org.Slug, "command", c.ID, "error", err)
	}
}

// Sweep adopts running commands whose follower lease lapsed (a replica
// died, or this process restarted), in every org, once.
func (f *Followers) Sweep(ctx context.Context) {
	slugs, err := f.ListOrgs(ctx)
	if err != nil {
		f.logger().Warn("recording sweep: skipped, orgs could not be listed", "error", err)
		return
	}
	for _, slug := range slugs {
		org, release, err := f.OpenOrg(ctx, slug)
		if err != nil {
			f.logger().Warn("recording sweep: org skipped", "org", slug, "error", err)
			continue
		}
		cs, err := recordings.Unfollowed(ctx, org.DB, f.now(), 500)
		f.backfillIndex(ctx, slug, org)
		release()
		if err != nil {
			f.logger().Warn("recording sweep: org skipped", "org", slug, "error", err)
			continue
		}
		for _, c := range cs {
			f.Follow(slug, c.ID)
		}
	}
}

// backfillBatch is how many unindexed commands one sweep indexes per org.
const backfillBatch = 200

// backfillIndex indexes, a batch per sweep, the commands of org that ended
// before recording search existed; commands ending now are indexed with
// their end. Once an org has none left this process stops looking.
func (f *Followers) backfillIndex(ctx context.Context, slug string, org Org) {
	f.mu.Lock()
	done := f.indexed[slug] == org.DB
	f.mu.Unlock()
	if done {
		return
	}
	n, err := recordings.IndexMissing(ctx, org.DB, backfillBatch)
	if err != nil {
		f.logger().Warn("recording sweep: search backfill failed", "org", slug, "error", err)
		return
	}
	if n < backfillBatch {
		f.mu.Lock()
		if f.indexed == nil {
			f.indexed = map[string]*gorm.DB{}
		}
		f.indexed[slug] = org.DB
		f.mu.Unlock()
	}
}

// Run sweeps at start and then on every tick until ctx ends. Tests drive
// it with their own tick channel.
func (f *Followers) Run(ctx context.Context, tick <-chan time.Time) {
	f.Sweep(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			f.Sweep(ctx)
		}
	}
}

// renewEvery is how often the leases of followed commands are renewed: a
// third of the lease, so two renewals may fail (the database away for a
// moment) before another replica takes a command over.
func (f *Followers) renewEvery() time.Duration { return max(f.lease()/3, 10*time.Millisecond) }

// renew extends the leases of every command this process follows, one
// statement per org per interval, until ctx ends.
func (f *Followers) renew(ctx context.Context) {
	t := time.NewTicker(f.renewEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.RenewNow(ctx)
		}
	}
}

// RenewNow renews the leases of every command this process follows, one
// statement per org.
func (f *Followers) RenewNow(ctx context.Context) {
	byOrg := map[string][]int64{}
	f.mu.Lock()
	for k := range f.running {
		byOrg[k.org] = append(byOrg[k.org], k.id)
	}
	f.mu.Unlock()
	until := f.now().Add(f.lease())
	for slug, ids := range byOrg {
		org, release, err := f.OpenOrg(ctx, slug)
		if err != nil {
			if ctx.Err() == nil {
				f.logger().Warn("recording followers: leases not renewed", "org", slug, "error", err)
			}
			continue
		}
		if _, err := recordings.RenewLeases(ctx, org.DB, f.Owner, ids, until); err != nil && ctx.Err() == nil {
			f.logger().Warn("recording followers: leases not renewed", "org", slug, "error", err)
		}
		release()
	}
}
