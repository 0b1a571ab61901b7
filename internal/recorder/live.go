package recorder

import (
	"context"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/gatehouse/gatehouse/internal/agentd"
)

// Each output byte of a recorded command is read from agentd once, by its
// follower: clients' long-polls of a live command followed on this
// replica are answered from what the follower just read, kept here in a
// window shared by every waiter of that command, instead of each poll
// asking agentd again. A client behind the window reads the recording; a
// command not followed here (another replica holds its lease), or whose
// follower is stalled (the database or agentd away), is polled at agentd
// as before.

// liveWindow bounds the bytes kept per command: a client further behind
// reads the recording. Only chunks already stored leave the window, so
// the window and the recording together always hold every chunk.
const liveWindow = 8 << 20

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
	// chunks hold every chunk with an id above base, up to next.
	chunks []agentd.Chunk
	bytes  int
	base   uint64
	next   uint64
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

// live is the shared output of the commands this process follows.
type live struct {
	mu   sync.Mutex
	cmds map[liveKey]*liveCmd
}

// publish adds what the follower read after cursor (agentd's answer resp).
func (l *live) publish(k liveKey, db *gorm.DB, cursor uint64, resp *agentd.SessionResponse) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cmds == nil {
		l.cmds = map[liveKey]*liveCmd{}
	}
	c := l.cmds[k]
	if c != nil && c.db != db {
		// The org was deleted and created again: another command.
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
		c.chunks, c.bytes, c.base, c.next = nil, 0, cursor, cursor
	}
	for _, ch := range resp.Chunks {
		if ch.ID <= c.next {
			continue // read twice
		}
		c.chunks = append(c.chunks, ch)
		c.bytes += len(ch.Data)
		c.next = ch.ID
	}
	if resp.NextCursor > c.next && len(resp.Chunks) == 0 {
		c.next = resp.NextCursor
	}
	c.state, c.exitCode, c.more, c.reading = resp.State, resp.ExitCode, resp.More, true
	c.trim()
	close(c.changed)
	c.changed = make(chan struct{})
}

// trim drops the oldest stored chunks while the window is over its size.
func (c *liveCmd) trim() {
	i := 0
	for c.bytes > liveWindow && i < len(c.chunks) && c.chunks[i].ID <= c.stored {
		c.bytes -= len(c.chunks[i].Data)
		c.base = c.chunks[i].ID
		i++
	}
	if i > 0 {
		c.chunks = append([]agentd.Chunk(nil), c.chunks[i:]...)
	}
}

// storedTo records that the recording holds every chunk up to last.
func (l *live) storedTo(k liveKey, last uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.cmds[k]; c != nil && last > c.stored {
		c.stored = last
		c.trim()
	}
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
		delete(l.cmds, k)
		close(c.changed)
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

// LiveWaiting is how many client polls of command id of org wait on this
// process's window of its output: polls that agentd does not see.
func (f *Followers) LiveWaiting(org string, id int64) int {
	f.live.mu.Lock()
	defer f.live.mu.Unlock()
	if c := f.live.cmds[liveKey{org, id}]; c != nil {
		return c.waiting
	}
	return 0
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

// liveCount is how many commands have a window (for tests).
func (f *Followers) liveCount() int {
	f.live.mu.Lock()
	defer f.live.mu.Unlock()
	return len(f.live.cmds)
}
