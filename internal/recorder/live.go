package recorder

import (
	"context"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// liveWindow bounds the bytes kept per command: a client further behind
// reads the recording.
const liveWindow = 8 << 20

// DefaultLiveBudget bounds the bytes every followed command's window holds
// together in one process (Followers.LiveBudget's default). With 2,000
// followed commands of which 200 print bulk output at once
// (BenchmarkLiveWindow), 256 MiB is the smallest budget that still
// answers every poll 1 MiB behind a bulk command from memory; at 128 MiB
// those polls all read the recording. A publish costs a few microseconds
// at it.
const DefaultLiveBudget = 256 << 20

// chunkOverhead is what a kept chunk costs beyond its bytes (the chunk,
// its stream name and the window's bookkeeping): a window of one-byte
// echoes is bounded too.
const chunkOverhead = 64

func chunkSize(ch agentd.Chunk) int { return len(ch.Data) + chunkOverhead }

// liveAnswerBytes bounds one answer from the window (agentd answers up to
// its --poll-bytes, 1 MiB by default; clients read at most 16 MiB).
const liveAnswerBytes = 4 << 20

type liveKey struct {
	org string
	id  int64
}

// liveCmd is one followed command's recent output and state.
type liveCmd struct {
	// db is the org's open pool: ids start over in a re-created org.
	db *gorm.DB
	// chunks hold every chunk with an id above base, up to next; arrived
	// says when each came, in the process's order of arrival.
	chunks  []agentd.Chunk
	arrived []uint64
	bytes   int
	base    uint64
	next    uint64
	// waiting counts the client polls waiting on the window for output.
	waiting int
	// last is agentd's last answer, without its chunks.
	state    string
	exitCode *int
	more     bool
	// stored is the last chunk the recording holds.
	stored uint64
	// reading is false while the follower is not reading agentd (it is
	// waiting out a failure): clients ask agentd themselves meanwhile.
	reading bool
	// changed is closed (and replaced) at every change.
	changed chan struct{}
}

// live is the shared output of the commands this process follows: a
// window per command, together bounded by a budget. Chunks the recording
// holds leave first, oldest first over every command; a client behind a
// window reads the recording, or agentd for what is not stored yet
// (agentd keeps it until it is).
type live struct {
	mu   sync.Mutex
	cmds map[liveKey]*liveCmd
	// bytes is what every window holds (chunkSize each); arrivals numbers
	// chunks as they come; evicted counts the bytes the budget pushed out.
	bytes    int64
	arrivals uint64
	evicted  int64
	// order lists the windows' chunks in order of arrival, with chunks
	// that left since (stale: see liveRef.held) until they are passed.
	order []liveRef
	held  int // chunks in every window
}

// liveRef is a chunk of c's window by its arrival.
type liveRef struct {
	c       *liveCmd
	arrival uint64
}

// held reports whether the chunk is still in its window: a window holds
// the chunks of its command that arrived since its first.
func (r liveRef) held() bool { return len(r.c.arrived) > 0 && r.arrival >= r.c.arrived[0] }

// first reports whether the chunk is its window's first (the only one of
// a window that may leave).
func (r liveRef) first() bool { return len(r.c.arrived) > 0 && r.arrival == r.c.arrived[0] }

// publish adds what the follower read after cursor (agentd's answer resp),
// keeping every window together within budget.
func (l *live) publish(k liveKey, db *gorm.DB, cursor uint64, resp *agentd.SessionResponse, budget int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cmds == nil {
		l.cmds = map[liveKey]*liveCmd{}
	}
	c := l.cmds[k]
	if c != nil && c.db != db {
		// The org was deleted and created again: another command.
		l.drop(c, len(c.chunks))
		close(c.changed)
		c = nil
	}
	if c == nil {
		c = &liveCmd{db: db, changed: make(chan struct{}), base: cursor, next: cursor, stored: cursor}
		l.cmds[k] = c
	}
	if cursor > c.next || cursor < c.base || resp.Truncated {
		// Not after what the window holds (a re-read from elsewhere, or
		// output lost to agentd's buffer): start the window afresh.
		l.drop(c, len(c.chunks))
		c.base, c.next = cursor, cursor
	}
	for _, ch := range resp.Chunks {
		if ch.ID <= c.next {
			continue // read twice
		}
		l.arrivals++
		c.chunks = append(c.chunks, ch)
		c.arrived = append(c.arrived, l.arrivals)
		l.order = append(l.order, liveRef{c, l.arrivals})
		l.held++
		c.bytes += chunkSize(ch)
		l.bytes += int64(chunkSize(ch))
		c.next = ch.ID
	}
	if resp.NextCursor > c.next && len(resp.Chunks) == 0 {
		c.next = resp.NextCursor
	}
	c.state, c.exitCode, c.more, c.reading = resp.State, resp.ExitCode, resp.More, true
	l.trim(c)
	l.evict(budget, c)
	close(c.changed)
	c.changed = make(chan struct{})
}

// drop removes the first n chunks of c's window (the base moves past
// them), returning their bytes.
func (l *live) drop(c *liveCmd, n int) int64 {
	if n == 0 {
		return 0
	}
	size := 0
	for _, ch := range c.chunks[:n] {
		size += chunkSize(ch)
	}
	c.base = c.chunks[n-1].ID
	// Cleared, so the bytes are freed before the array is reallocated.
	clear(c.chunks[:n])
	c.chunks, c.arrived = c.chunks[n:], c.arrived[n:]
	c.bytes -= size
	l.bytes -= int64(size)
	l.held -= n
	return int64(size)
}

// trim drops c's oldest stored chunks while its window is over its size.
func (l *live) trim(c *liveCmd) {
	i, size := 0, c.bytes
	for size > liveWindow && i < len(c.chunks) && c.chunks[i].ID <= c.stored {
		size -= chunkSize(c.chunks[i])
		i++
	}
	l.drop(c, i)
}

// evict drops chunks while every window together holds more than budget
// (DefaultLiveBudget when not positive): stored chunks first, oldest
// first over every command; then, if that was not enough, chunks not
// stored yet, which agentd still holds for the clients that need them.
// The windows it shrinks, but for the one being changed (current), are
// told at once.
func (l *live) evict(budget int64, current *liveCmd) {
	if budget <= 0 {
		budget = DefaultLiveBudget
	}
	var shrunk []*liveCmd
	out := func(r liveRef) {
		l.evicted += l.drop(r.c, 1)
		if r.c != current && (len(shrunk) == 0 || shrunk[len(shrunk)-1] != r.c) {
			shrunk = append(shrunk, r.c)
		}
	}
	// Stored chunks first: only a window's first chunk may leave, and one
	// not stored keeps the window's later chunks (not stored either).
	for i := 0; l.bytes > budget && i < len(l.order); i++ {
		if r := l.order[i]; r.first() && r.c.chunks[0].ID <= r.c.stored {
			out(r)
		}
	}
	for i := 0; l.bytes > budget && i < len(l.order); i++ {
		if r := l.order[i]; r.first() {
			out(r)
		}
	}
	for _, c := range shrunk {
		close(c.changed)
		c.changed = make(chan struct{})
	}
	l.tidy()
}

// tidy passes the chunks at the head of order that left their window, and
// rebuilds order when most of it is such chunks, so order stays within
// twice what the windows hold.
func (l *live) tidy() {
	n := 0
	for n < len(l.order) && !l.order[n].held() {
		n++
	}
	clear(l.order[:n])
	l.order = l.order[n:]
	if len(l.order) > 2*l.held+1024 {
		kept := make([]liveRef, 0, 2*l.held+64)
		for _, r := range l.order {
			if r.held() {
				kept = append(kept, r)
			}
		}
		l.order = kept
	}
}

// storedTo records that the recording holds every chunk up to last.
func (l *live) storedTo(k liveKey, last uint64, budget int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.cmds[k]; c != nil && last > c.stored {
		c.stored = last
		l.trim(c)
		l.evict(budget, nil)
	}
}

// LiveUse is what the windows of the commands followed here hold and
// serve.
type LiveUse struct {
	// Held is the bytes every window holds (each chunk's bytes and 64 for
	// its bookkeeping).
	Held int64
	// Evicted is the bytes the budget pushed out since the process
	// started: clients needing them read the recording.
	Evicted int64
	// Waiting counts the clients' long-polls waiting on a window for
	// output: polls agentd does not see.
	Waiting int
}

func (l *live) use() LiveUse {
	l.mu.Lock()
	defer l.mu.Unlock()
	u := LiveUse{Held: l.bytes, Evicted: l.evicted}
	for _, c := range l.cmds {
		u.Waiting += c.waiting
	}
	return u
}

// stalled marks the follower of k as not reading agentd for now.
func (l *live) stalled(k liveKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.cmds[k]; c != nil && c.reading {
		c.reading = false
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// forget drops k's window: its follower ended. Waiters wake and read the
// recording (or agentd).
func (l *live) forget(k liveKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.cmds[k]; c != nil {
		l.drop(c, len(c.chunks))
		delete(l.cmds, k)
		close(c.changed)
		l.tidy()
	}
}

// LiveStatus says how ReadLive answered.
type LiveStatus int

const (
	// LiveAnswered: the answer is in the response.
	LiveAnswered LiveStatus = iota
	// LiveBehind: the client's cursor is before the window; read the
	// recording.
	LiveBehind
	// LiveUnknown: this process does not follow the command now (or its
	// follower is stalled, or the cursor is ahead of it); ask agentd.
	LiveUnknown
)

// ReadLive answers a client's long-poll of command id of org (whose open
// pool is db), after cursor, waiting up to wait for output, from what
// the command's follower read: as agentd would answer it.
func (f *Followers) ReadLive(ctx context.Context, org string, db *gorm.DB, id int64, cursor uint64, wait time.Duration) (*agentd.SessionResponse, LiveStatus, error) {
	k := liveKey{org, id}
	var timer *time.Timer
	for {
		f.live.mu.Lock()
		c := f.live.cmds[k]
		switch {
		case c == nil || c.db != db || !c.reading || cursor > c.next:
			f.live.mu.Unlock()
			return nil, LiveUnknown, nil
		case cursor < c.base:
			f.live.mu.Unlock()
			return nil, LiveBehind, nil
		}
		if resp := c.answer(cursor); resp != nil || wait <= 0 {
			f.live.mu.Unlock()
			if resp == nil {
				resp = &agentd.SessionResponse{State: agentd.StateRunning, NextCursor: cursor, Chunks: []agentd.Chunk{}}
			}
			return resp, LiveAnswered, nil
		}
		changed := c.changed
		c.waiting++
		f.live.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		var err error
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-timer.C:
			wait = 0 // answer what there is, nothing new
		case <-changed:
		}
		f.live.mu.Lock()
		c.waiting--
		f.live.mu.Unlock()
		if err != nil {
			return nil, LiveAnswered, err
		}
	}
}

// answer is what the window says after cursor (in the window), or nil
// when the command runs and nothing came after cursor yet.
func (c *liveCmd) answer(cursor uint64) *agentd.SessionResponse {
	i := 0
	for i < len(c.chunks) && c.chunks[i].ID <= cursor {
		i++
	}
	if i == len(c.chunks) && c.state == agentd.StateRunning {
		return nil
	}
	resp := &agentd.SessionResponse{State: c.state, ExitCode: c.exitCode, NextCursor: cursor, Chunks: []agentd.Chunk{}}
	n := 0
	for ; i < len(c.chunks); i++ {
		if len(resp.Chunks) > 0 && n+len(c.chunks[i].Data) > liveAnswerBytes {
			break
		}
		resp.Chunks = append(resp.Chunks, c.chunks[i])
		n += len(c.chunks[i].Data)
		resp.NextCursor = c.chunks[i].ID
	}
	if i < len(c.chunks) || (resp.NextCursor == c.next && c.more) {
		resp.More = true
	}
	if !resp.More && resp.NextCursor < c.next {
		resp.NextCursor = c.next
	}
	if resp.More {
		// Output still to come: the command's end is said with the
		// last of it, as agentd does.
		resp.State, resp.ExitCode = agentd.StateRunning, nil
	}
	return resp
}

// LiveWindow says what the windows of the commands followed here hold
// and serve, for the console's metrics.
func (f *Followers) LiveWindow() LiveUse { return f.live.use() }

// publish hands what the follower of k read after cursor to its clients.
func (f *Followers) publish(k liveKey, db *gorm.DB, cursor uint64, resp *agentd.SessionResponse) {
	f.live.publish(k, db, cursor, resp, f.LiveBudget)
}

// storedTo lets k's window release what the recording holds, up to last.
func (f *Followers) storedTo(k liveKey, last uint64) { f.live.storedTo(k, last, f.LiveBudget) }

// liveCount is how many commands have a window (for tests).
func (f *Followers) liveCount() int {
	f.live.mu.Lock()
	defer f.live.mu.Unlock()
	return len(f.live.cmds)
}
