package agentd

// ring is a session's bounded output buffer: a deque of chunks whose cost
// together stays within max. A chunk costs its data capacity plus
// chunkOverhead, so a flood of one-byte writes cannot hold millions of
// chunk headers within a limit meant for data. Small reads are coalesced
// into the newest chunk while no reader has been handed it, which keeps
// the chunk count low for any write pattern.
//
// Chunk data is allocated per chunk as output arrives, so an idle session
// holds no buffer at all. Chunk data is never mutated once a reader has
// been given the chunk (or a cursor at or past it), so readers may keep
// slices of it after the session lock is released. ring is not safe for
// concurrent use.
type ring struct {
	max    int
	chunks []chunk // live chunks are chunks[head:]
	head   int
	bytes  int    // cost of the live chunks
	lastID uint64 // id of the newest chunk ever appended (0: none)
	total  uint64 // bytes ever appended, including dropped ones

	// served is the highest cursor handed out to any reader. Chunks above
	// it are unread and may still grow by coalescing.
	served uint64

	// blocking rings never evict a chunk above acked, the highest cursor a
	// poller has asked for; the producer waits for room instead.
	blocking bool
	acked    uint64

	// evictedEnds remembers the end offsets of the most recently evicted
	// chunks, indexed by id modulo evictedWindow, so a cursor that fell
	// behind learns exactly how many bytes it lost. Allocated on first
	// eviction.
	evictedEnds []uint64
	lastEvicted uint64

	// spare holds data buffers of evicted chunks no reader was ever given,
	// for reuse: a command flooding output nobody reads then churns no
	// garbage, which would otherwise inflate the heap between collections.
	spare      [][]byte
	spareBytes int
}

// maxSpare bounds how many evicted buffers a ring keeps for reuse (and
// their capacity is bounded by a quarter of the ring).
const maxSpare = 16

type chunk struct {
	id     uint64
	stream uint8
	end    uint64 // offset just past the chunk in the whole output
	data   []byte // may have lost its head if it alone exceeded max
}

const (
	// evictedWindow is how many evicted chunks keep their end offsets.
	evictedWindow = 4096
	// chunkOverhead is what a chunk costs besides its data: the chunk
	// header (48 bytes), its share of the deque's spare capacity and the
	// allocator's rounding of the data.
	chunkOverhead = 128
	// coalesceMax bounds a chunk grown by coalescing, so one chunk never
	// dominates a poll response or a ring.
	coalesceMax = 64 << 10
)

// Stream numbers stored in chunks.
const (
	streamStdout uint8 = iota
	streamStderr
	streamPTY
)

func streamName(s uint8) string {
	switch s {
	case streamStderr:
		return StreamStderr
	case streamPTY:
		return StreamPTY
	case streamExec:
		return StreamExec
	case streamNet:
		return StreamNet
	default:
		return StreamStdout
	}
}

func (r *ring) live() []chunk { return r.chunks[r.head:] }

// maxData is the most data one chunk may hold so that it fits the ring.
func (r *ring) maxData() int { return max(r.max-chunkOverhead, 1) }

// coalesceLimit is the size up to which the newest chunk may grow.
func (r *ring) coalesceLimit() int { return min(coalesceMax, r.max/4) }

// fits reports whether n more bytes can be appended in blocking mode without
// evicting output no poller has asked past. Non-blocking rings always fit.
func (r *ring) fits(n int) bool {
	if !r.blocking {
		return true
	}
	// The room add will take: a new chunk's buffer is rounded up to its
	// size class (and a blocking ring reuses only buffers of exactly that
	// class, see buffer), so reserving n alone let add evict output no
	// poller had asked past.
	cost := bufClass(min(n, r.maxData()), r.maxData()) + chunkOverhead
	r.evict(r.bytes+cost-r.max, true)
	return r.bytes == 0 || r.bytes+cost <= r.max
}

// ack records that a poller asked for chunks after cursor, which makes older
// chunks evictable in blocking mode.
func (r *ring) ack(cursor uint64) bool {
	if cursor <= r.acked {
		return false
	}
	r.acked = min(cursor, r.lastID)
	return true
}

// serve records that cursor was handed to a reader: the chunks up to it
// must not change any more.
func (r *ring) serve(cursor uint64) {
	r.served = max(r.served, cursor)
}

// bufClass rounds a buffer size up to a power of two (at least 256, at
// most limit), so evicted buffers fit later output of similar size and the
// heap does not fragment into odd sizes.
func bufClass(n, limit int) int {
	c := 256
	for c < n {
		c <<= 1
	}
	if c > limit {
		return max(n, limit)
	}
	return c
}

// buffer returns an empty buffer of at least bufClass(n, limit) bytes: the
// smallest spare one of up to four times that (exactly that in a blocking
// ring, whose room was reserved for that size), else a new one.
func (r *ring) buffer(n, limit int) []byte {
	want := bufClass(n, limit)
	most := 4 * want
	if r.blocking {
		most = want
	}
	best := -1
	for i, b := range r.spare {
		if cap(b) >= want && cap(b) <= most && (best < 0 || cap(b) < cap(r.spare[best])) {
			best = i
		}
	}
	if best < 0 {
		return make([]byte, 0, want)
	}
	b := r.spare[best]
	last := len(r.spare) - 1
	r.spare[best], r.spare[last] = r.spare[last], nil
	r.spare = r.spare[:last]
	r.spareBytes -= cap(b)
	return b[:0]
}

// minSpare is the smallest buffer worth keeping: smaller ones are cheap to
// allocate and would crowd out the big ones.
const minSpare = 4 << 10

// recycle keeps b for reuse if no reader can hold it.
func (r *ring) recycle(b []byte, served bool) {
	if served || cap(b) < minSpare || len(r.spare) >= maxSpare || r.spareBytes+cap(b) > r.max/4 {
		return
	}
	r.spare = append(r.spare, b)
	r.spareBytes += cap(b)
}

// dropSpares releases the reuse buffers, e.g. once the session has ended.
func (r *ring) dropSpares() { r.spare, r.spareBytes = nil, 0 }

// add appends a copy of data, coalescing it into the newest chunk while
// that is unread, and evicts (or trims) the oldest output so the ring stays
// within max.
func (r *ring) add(stream uint8, data []byte) {
	r.total += uint64(len(data))
	if live := r.live(); len(live) > 0 {
		c := &live[len(live)-1]
		need := len(c.data) + len(data)
		newCap := cap(c.data)
		if need > newCap {
			// A chunk that coalesces is likely to keep doing so: grow it
			// to the limit at once rather than through every size.
			newCap = bufClass(r.coalesceLimit(), r.coalesceLimit())
		}
		// A blocking ring coalesces only into room it has: fits
		// reserved room for a new chunk, not for a grown one.
		room := !r.blocking || r.bytes+newCap-cap(c.data) <= r.max
		if c.id > r.served && c.stream == stream && need <= r.coalesceLimit() && room {
			before := cap(c.data)
			if newCap > cap(c.data) {
				grown := append(r.buffer(newCap, r.coalesceLimit()), c.data...)
				r.recycle(c.data, false)
				c.data = grown
			}
			c.data = append(c.data, data...)
			c.end = r.total
			r.bytes += cap(c.data) - before
			// Never evicts c itself: it is at most a quarter of max.
			r.evict(r.bytes-r.max, false)
			return
		}
	}
	if len(data) > r.maxData() {
		data = data[len(data)-r.maxData():]
	}
	data = append(r.buffer(len(data), r.maxData()), data...)
	cost := cap(data) + chunkOverhead
	r.evict(r.bytes+cost-r.max, false)
	r.lastID++
	r.chunks = append(r.chunks, chunk{id: r.lastID, stream: stream, end: r.total, data: data})
	r.bytes += cost
}

// addExec appends exec records (one or more JSON lines) like add, but a
// blocking ring never waits for room or evicts output no poller has asked
// past: the records come from the loop reading the kernel's events, which
// must not stop. The session bounds how far over max that may go.
func (r *ring) addExec(data []byte) { r.addRecords(streamExec, data) }

// addRecords appends records of stream (exec or net) as addExec says.
func (r *ring) addRecords(stream uint8, data []byte) {
	if !r.blocking {
		r.add(stream, data)
		return
	}
	r.total += uint64(len(data))
	if live := r.live(); len(live) > 0 {
		c := &live[len(live)-1]
		if c.id > r.served && c.stream == stream && len(c.data)+len(data) <= r.coalesceLimit() {
			before := cap(c.data)
			c.data = append(c.data, data...)
			c.end = r.total
			r.bytes += cap(c.data) - before
			r.evict(r.bytes-r.max, true)
			return
		}
	}
	buf := append(make([]byte, 0, max(len(data), 256)), data...)
	cost := cap(buf) + chunkOverhead
	r.evict(r.bytes+cost-r.max, true)
	r.lastID++
	r.chunks = append(r.chunks, chunk{id: r.lastID, stream: stream, end: r.total, data: buf})
	r.bytes += cost
}

// evict drops the oldest chunks until need bytes are freed (or, with
// ackedOnly, until the next chunk is one no poller has asked past).
func (r *ring) evict(need int, ackedOnly bool) {
	for need > 0 && r.head < len(r.chunks) {
		c := &r.chunks[r.head]
		if ackedOnly && c.id > r.acked {
			return
		}
		if r.evictedEnds == nil {
			r.evictedEnds = make([]uint64, evictedWindow)
		}
		r.evictedEnds[c.id%evictedWindow] = c.end
		r.lastEvicted = c.id
		cost := cap(c.data) + chunkOverhead
		need -= cost
		r.bytes -= cost
		r.recycle(c.data, c.id <= r.served)
		*c = chunk{}
		r.head++
	}
	if r.head == len(r.chunks) {
		r.chunks, r.head = r.chunks[:0], 0
	} else if r.head >= 256 && r.head*2 >= len(r.chunks) {
		n := copy(r.chunks, r.chunks[r.head:])
		clear(r.chunks[n:])
		r.chunks, r.head = r.chunks[:n], 0
	}
	// Give back a deque that a burst of chunks grew far beyond what is
	// live, so its spare capacity stays within the per-chunk overhead.
	if live := len(r.chunks) - r.head; cap(r.chunks) > 1024 && live*4 < cap(r.chunks) {
		shrunk := make([]chunk, live, live*2)
		copy(shrunk, r.chunks[r.head:])
		r.chunks, r.head = shrunk, 0
	}
}

// endOffset is the output offset just past chunk id, or the best lower bound
// when the chunk was evicted too long ago to remember.
func (r *ring) endOffset(id uint64) uint64 {
	if id == 0 {
		return 0
	}
	live := r.live()
	if len(live) > 0 && id >= live[0].id {
		return live[id-live[0].id].end
	}
	if r.lastEvicted == 0 {
		return 0
	}
	oldest := uint64(1)
	if r.lastEvicted > evictedWindow {
		oldest = r.lastEvicted - evictedWindow + 1
	}
	if id < oldest {
		// Forgotten: the oldest remembered end bounds what the cursor saw,
		// so the drop count is a lower bound.
		return r.evictedEnds[oldest%evictedWindow]
	}
	return r.evictedEnds[id%evictedWindow]
}

// readResult is what one read of the ring returns.
type readResult struct {
	chunks  []Chunk
	next    uint64 // cursor to use next
	dropped uint64 // bytes between cursor and the first chunk that were lost
	more    bool   // chunks remain after next (the byte cap was reached)
}

// read returns the chunks after cursor (sharing their data) up to about
// maxBytes of data (at least one chunk), so a poll costs what it returns
// however much is buffered. cursor must not exceed lastID.
func (r *ring) read(cursor uint64, maxBytes int) readResult {
	live := r.live()
	retainedStart := r.total
	if len(live) > 0 {
		retainedStart = live[0].end - uint64(len(live[0].data))
	}
	var res readResult
	if seen := r.endOffset(cursor); seen < retainedStart {
		res.dropped = retainedStart - seen
	}
	first := 0
	if len(live) > 0 && cursor >= live[0].id {
		first = int(cursor - live[0].id + 1)
	}
	rest := live[first:]
	n, size := 0, 0
	for n < len(rest) && (n == 0 || size+len(rest[n].data) <= maxBytes) {
		size += len(rest[n].data)
		n++
	}
	res.chunks = make([]Chunk, n)
	for i, c := range rest[:n] {
		res.chunks[i] = Chunk{ID: c.id, Stream: streamName(c.stream), Data: c.data}
	}
	res.next = r.lastID
	if n < len(rest) {
		res.next, res.more = rest[n-1].id, true
	}
	r.serve(res.next)
	return res
}
